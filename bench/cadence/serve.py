"""The worker side: one process serving sessions of a trace against the clock.

``python -m bench.cadence --worker ...`` builds the arm's server once (outside the
measurement), then waits at a barrier: it creates ``<ready>`` and polls ``<go>`` for
the shared wall-clock start time the driver writes once every worker of the run is
ready (the per-process arm starts N of them together). From the start, one client
thread per session opens its session at its arrival time, calls ``reset`` at a turn
that starts with one, and submits each chunk at its arrival time; ``submit`` returns
when the chunk's output is ready. The latency of a chunk is from its arrival time to
that return (so a backlog counts), the first packet of a turn is its chunk ``k == 0``.
Outputs are hashed per session and stream after the latency is taken. A server that
can take a chunk without waiting for its output (``send`` / ``receive``: the lockstep
pool) gets each chunk at its arrival time whatever the earlier ones' state, as a
full-duplex client's microphone sends it; the latency is then from the arrival time to
when the chunk's tick ended, and outputs are hashed in order as they come.

``--unpaced`` serves the sessions one after another as fast as they go (the solo
reference runs: bytes must not depend on timing). The worker prints one JSON line:
per-chunk records, per-session hashes and open times, the process's peak device
memory, its measured window (epoch seconds) and the server's own stats.
"""

from __future__ import annotations

import os
import threading
import time
import traceback
from collections import deque
from pathlib import Path
from typing import Any

from duplexcadence.runtime import determinism_settings, pin_determinism

from bench.harness.process import print_result_line
from bench.harness.worker import Hashes, envelope_holds, resolve_device

from .trace import Chunk, SessionSpec


class Client:
    """One real-time client: its session's chunks at their times, latencies recorded."""

    def __init__(self, server: Any, spec: SessionSpec, streams: tuple, t0: float) -> None:
        self.server, self.spec, self.t0 = server, spec, t0
        self.hashes = Hashes(streams)
        self.rows: list[tuple] = []  # (session, turn, k, arrival_s, latency_ms)
        self.open_ms: float | None = None
        self.error: str | None = None

    def wait(self, at_s: float | None) -> None:
        if at_s is not None:
            time.sleep(max(0.0, self.t0 + at_s - time.perf_counter()))

    def serve(self, paced: bool = True) -> None:
        try:
            self.wait(self.spec.arrival_s if paced else None)
            t = time.perf_counter()
            session = self.server.open(self.spec)
            self.open_ms = (time.perf_counter() - t) * 1e3
            if paced and hasattr(self.server, "send"):
                self.serve_ahead(session)
            else:
                for chunk in self.spec.chunks:
                    self.chunk(session, chunk, paced)
            self.server.close(session)
        except Exception as e:  # noqa: BLE001 - recorded; the run is then not ok
            self.error = f"session {self.spec.index}: {type(e).__name__}: {e}"
            traceback.print_exc()

    def serve_ahead(self, session: Any) -> None:
        """Every chunk sent at its arrival time (``server.send``), its output taken
        (``server.receive``) once it is done, in order: a stream that fell behind has its
        next chunks in already."""
        sent: deque = deque()
        for chunk in self.spec.chunks:
            self.wait(chunk.arrival_s)
            if chunk.reset:
                self.take(sent, until_empty=True)  # a reset starts after what came before
                self.server.reset(session)
            sent.append((chunk, self.server.send(session, chunk)))
            self.take(sent, until_empty=False)
        self.take(sent, until_empty=True)

    def take(self, sent: deque, until_empty: bool) -> None:
        while sent and (until_empty or sent[0][1].done.is_set()):
            chunk, handle = sent.popleft()
            out, done_at = self.server.receive(handle)
            latency = (done_at - (self.t0 + chunk.arrival_s)) * 1e3
            self.rows.append((chunk.session, chunk.turn, chunk.k, chunk.arrival_s, latency))
            self.hashes.add(out)

    def chunk(self, session: Any, chunk: Chunk, paced: bool) -> None:
        self.wait(chunk.arrival_s if paced else None)
        arrival = self.t0 + chunk.arrival_s if paced else time.perf_counter()
        if chunk.reset:
            self.server.reset(session)
        out = self.server.submit(session, chunk)
        latency = (time.perf_counter() - arrival) * 1e3
        self.rows.append((chunk.session, chunk.turn, chunk.k, chunk.arrival_s, latency))
        self.hashes.add(out)


def barrier(ready: Path | None, go: Path | None, timeout_s: float) -> float:
    """Signal ready, wait for the start epoch the driver writes; the start as a
    ``time.perf_counter`` value."""
    if ready is None or go is None:
        return time.perf_counter() + 0.5
    ready.write_text(str(os.getpid()))
    deadline = time.time() + timeout_s
    while not go.exists():
        if time.time() > deadline:
            raise TimeoutError(f"no start signal in {timeout_s:.0f} s ({go})")
        time.sleep(0.02)
    start_epoch = float(go.read_text())
    return time.perf_counter() + (start_epoch - time.time())


def serve(wl: Any, args: Any, specs: list[SessionSpec], result: dict) -> None:
    import torch

    arm = wl.arm(args.arm)
    device = resolve_device(args, arm)
    cuda = device.type == "cuda"
    env = determinism_settings(device)
    result.update(
        {k: env[k] for k in ("torch", "cuda")}, device_name=env["device"] if cuda else "cpu"
    )
    with pin_determinism(extra=wl.determinism):
        t = time.perf_counter()
        server = wl.server(arm, device)
        result["setup_s"] = time.perf_counter() - t
        if cuda:
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
        if hasattr(server, "peak_mib"):  # the memory lives in the server's processes
            server.reset_peak_memory()
        t0 = barrier(args.ready, args.go, args.barrier_timeout)
        clients = [Client(server, s, wl.streams, t0) for s in specs]
        window = [time.time() + (t0 - time.perf_counter()), None]
        if args.unpaced:
            for c in clients:
                c.serve(paced=False)
        else:
            threads = [threading.Thread(target=c.serve, daemon=True) for c in clients]
            for th in threads:
                th.start()
            for th in threads:
                th.join()
        window[1] = time.time()
        result["determinism_ok"] = envelope_holds(determinism_settings(device), wl.determinism)
    errors = [c.error for c in clients if c.error]
    rows = [r for c in clients for r in c.rows]
    keys = ("session", "turn", "k", "arrival_s", "latency_ms")
    result.update(
        window=window,
        chunks={k: [round(r[i], 3) if i >= 3 else r[i] for r in rows] for i, k in enumerate(keys)},
        hashes={c.spec.index: c.hashes.record() for c in clients if not c.error},
        open_ms={c.spec.index: c.open_ms for c in clients},
        peak_mib=run_peak_mib(server, device),
        server=getattr(server, "stats", dict)(),
        status="error" if errors else "ok",
    )
    if errors:
        result["error"] = "; ".join(errors)


def worker_main(wl: Any, args: Any, specs: list[SessionSpec]) -> dict:
    """Serve, then print the result as one JSON line."""
    result: dict[str, Any] = {"arm": args.arm, "sessions": [s.index for s in specs]}
    result.update(status="error", pid=os.getpid(), unpaced=args.unpaced)
    return print_result_line(lambda r: serve(wl, args, specs, r), result)


def run_peak_mib(server: Any, device: Any) -> float | None:
    """The run's device peak: the server's own count where it has one (its memory lives
    in other processes), else this process's."""
    import torch

    if hasattr(server, "peak_mib"):
        return server.peak_mib()
    return torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None
