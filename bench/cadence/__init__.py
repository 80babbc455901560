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

The interface a session workload implements (``workload.py``): a module with a
``SESSIONS = SessionWorkload(...)`` (or ``--workload module:ATTR``) declaring

* ``name``; ``arms``: ``Arm(name, shape, what, options={}, needs_cuda=False, env={})``
  with ``shape`` ``"inproc"`` (one worker process hosts all N sessions, one client
  thread each) or ``"procs"`` (N worker processes of one session each, released
  together); ``reference``: the arm whose solo run is each session's reference (stock);
  ``streams``: the outputs hashed per session, ``bench.harness.Stream(name, dtype, key,
  step_key)``; ``base_env``: environment for every worker (``NO_TORCH_COMPILE``...);
* ``server(arm, device)``: called once per worker process, outside the measurement
  (load weights, bind, capture, make lanes from ``arm.options``), returning a server
  with ``open(spec) -> session``, ``submit(session, chunk) -> {stream: array}`` (returns
  once the chunk's output is ready on the host), ``reset(session)`` (a new turn, in
  place), ``close(session)`` and optionally ``stats() -> dict``. ``spec`` is a
  ``trace.SessionSpec`` (``index``, ``seed``: the session's own inputs, ``arrival_s``,
  ``chunks``); ``chunk`` a ``trace.Chunk`` (``seq`` indexes the session's inputs,
  ``turn``, ``k`` within the turn, ``last_in_turn``, ``reset``). Inputs and outputs must
  be a function of the spec alone (the session's seed and chunk positions), so the
  bytes are comparable across arms, N and interleavings. ``inproc`` servers are called
  from several threads at once and serialise or dispatch onto lanes themselves.

The determinism envelope is pinned in every worker (``pin_determinism``), as in
``bench.harness``. ``tests/fake_sessions.py`` is a complete small example.
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
