"""Mimi's streaming encoder (transformers 4.57.6) vs the generated adapter: see
bench/transformers_mimi.py for the commands and what is measured."""

from bench.harness import main
from bench.transformers_mimi import workload

WORKLOAD = workload("encoder")

if __name__ == "__main__":
    raise SystemExit(main(WORKLOAD))
