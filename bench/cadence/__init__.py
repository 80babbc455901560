"""A paced cadence harness: N real-time sessions per GPU, each chunk against its deadline.

    python -m bench.cadence --workload bench.sessions_token2wav --n 1,8,16,24,32,36 \\
        --duration 60 --time-budget 570 --out bench/results/sessions_h200

What it measures, per arm and N (``sweep.py`` says in which order and within which
budget; ``serve.py`` how a worker serves; ``trace.py`` what the clients send): the
latency of every chunk from its arrival to its output (p50/p95/p99), deadline misses
(latency > ``--deadline-ms``, 1000 by default: one second of audio per chunk), the
first-packet latency of every turn, the GPU's busy share (NVML), the process peak
device memory (summed over processes for a per-process arm), and whether every
session's output bytes equal that session run alone on the reference arm in a fresh
process. Per arm: the largest N with zero misses over a run of at least 60 s. Writes
``<out>.json`` (top-level ``arms``: {arm: {max_sessions_at_cadence, p95_ms_at_16,
peak_gib_at_max, all_sessions_exact, sessions_hashed, ...}}, ``per_n``, ``runs``),
``<out>.md`` and ``<out>.png`` (p95 latency vs N per arm).

A session workload (``workload.py``: ``SessionWorkload``, ``Arm``, ``Server``) is a
module with ``SESSIONS = SessionWorkload(...)`` (or ``--workload module:ATTR``); its
inputs and outputs must be a function of the session's spec alone, so bytes compare
across arms, N and interleavings. ``tests/fake_sessions.py`` is a complete small example.
Every worker runs under the runtime's ``pin_determinism``, as in ``bench.harness``.
"""

from .trace import Chunk, SessionSpec, TraceSettings, session, trace
from .workload import Arm, Server, SessionWorkload

__all__ = [
    "Arm",
    "Chunk",
    "Server",
    "SessionSpec",
    "SessionWorkload",
    "TraceSettings",
    "session",
    "trace",
]
