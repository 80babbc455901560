"""Benchmarks and the real third-party workloads they drive (DESIGN §5, §6)."""
