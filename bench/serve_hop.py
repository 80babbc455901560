"""Time per chunk of the Ray Serve paths against the in-process server, by transport.

    python -m bench.serve_hop [--sessions 1,4] [--calls 150] [--rounds 4] [--out PATH]

What one chunk costs on each path to the same replica, with a model whose step is cheap
(default ``serve_toy:served`` from tests/, the toy stream on the fake graph backend), so
the difference is the path: ``inproc`` (``ReplicaServer.step`` in this process, no Ray),
``actor`` (``SessionClient``: a Ray actor call to the replica), ``grpc``
(``SessionClient(transport="grpc")``: Serve's gRPC transport), ``ingress`` (the ingress
handle: two hops), ``ingress_grpc`` (the same, a second application whose ingress
reaches its replica by gRPC: ``ServeConfig(transport="grpc")``). One replica on an embedded cluster; ``--sessions`` concurrent client
threads, each with its own session; the paths alternate in order every round, so the
machine's drift falls on all of them. Times are wall clock per call (p50, p95), the
first 20 calls of every round dropped. A CPU measurement of the paths' cost: the GPU
arms of ``bench.sessions_serve`` measure the same paths under the real model.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from bench.harness.process import REPO, git_info, write_json

PATHS = ("inproc", "actor", "grpc", "ingress", "ingress_grpc")
DROP = 20  # warm-up calls per round


def _times(step: Callable[[int], Any], calls: int) -> list[float]:
    out = []
    for i in range(calls):
        t = time.perf_counter()
        step(i)
        out.append(time.perf_counter() - t)
    return out[DROP:]


def _concurrent(steps: list[Callable[[int], Any]], calls: int) -> list[float]:
    results: list[list[float]] = [[] for _ in steps]
    threads = [
        threading.Thread(target=lambda k=k, s=s: results[k].extend(_times(s, calls)))
        for k, s in enumerate(steps)
    ]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return [t for r in results for t in r]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.serve_hop", description=__doc__)
    ap.add_argument("--sessions", default="1,4", help="concurrent sessions, comma-separated")
    ap.add_argument("--calls", type=int, default=150, help="calls per session per round")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--out", default=None, help="write PATH.json and PATH.md")
    args = ap.parse_args(argv)
    if args.calls <= DROP:
        ap.error(f"--calls must exceed the {DROP} warm-up calls")
    from duplexcadence.runtime.serve import ray_missing

    if (hint := ray_missing()) is not None:
        print(f"bench.serve_hop: {hint}", file=sys.stderr)
        return 2
    import ray

    sys.path.insert(0, str(REPO / "tests"))  # the toy model and its inputs
    from serve_toy import TOY
    from toy_stream import x_of

    from duplexcadence.runtime.serve import SessionClient
    from duplexcadence.runtime.serve.launch import init_local, start
    from duplexcadence.runtime.serve.replica import ReplicaServer

    counts = [int(n) for n in args.sessions.split(",")]
    # the first application holds the actor, gRPC and ingress paths' sessions
    config = dataclasses.replace(TOY, replicas=1, max_sessions=3 * max(counts))
    init_local(num_cpus=2, paths=(REPO / "tests",), shared_host=True, log_to_driver=False)
    ingress = start(config)
    grpc_config = dataclasses.replace(config, name=f"{config.name}_grpc", transport="grpc")
    ingress_grpc = start(grpc_config, route_prefix="/grpc")
    clients = {
        "actor": SessionClient(config.name),
        "grpc": SessionClient(config.name, transport="grpc"),
    }
    local = ReplicaServer(config)
    samples: dict[tuple[int, str], list[float]] = {}
    # each path: (open a session, one chunk of it, close it), with sessions of its own
    paths: dict[str, tuple[Callable, Callable, Callable]] = {
        "inproc": (
            local.open,
            lambda s, x: local.step(local.incarnation, s, x),
            lambda s: local.close(local.incarnation, s),
        ),
        "actor": (clients["actor"].open, clients["actor"].chunk, clients["actor"].close),
        "grpc": (clients["actor"].open, clients["grpc"].chunk, clients["actor"].close),
        "ingress": (
            lambda p: ingress.open.remote(p).result(),
            lambda s, x: ingress.chunk.remote(s, x).result(),
            lambda s: ingress.close.remote(s).result(),
        ),
        "ingress_grpc": (
            lambda p: ingress_grpc.open.remote(p).result(),
            lambda s, x: ingress_grpc.chunk.remote(s, x).result(),
            lambda s: ingress_grpc.close.remote(s).result(),
        ),
    }
    for n in counts:
        sids = {
            path: [open_({"seed": k}) for k in range(n)] for path, (open_, _, _) in paths.items()
        }
        steps = {
            path: [lambda i, s=s, k=k, c=chunk: c(s, x_of(k, i)) for k, s in enumerate(sids[path])]
            for path, (_, chunk, _) in paths.items()
        }
        for r in range(args.rounds):
            for path in PATHS if r % 2 == 0 else PATHS[::-1]:
                samples.setdefault((n, path), []).extend(_concurrent(steps[path], args.calls))
        for path, (_, _, close) in paths.items():
            for s in sids[path]:
                close(s)
    rows = [
        {
            "sessions": n,
            "path": path,
            "calls": len(t),
            "p50_ms": round(1e3 * statistics.median(t), 3),
            "p95_ms": round(1e3 * float(np.percentile(t, 95)), 3),
        }
        for (n, path), t in sorted(
            samples.items(), key=lambda kv: (kv[0][0], PATHS.index(kv[0][1]))
        )
    ]
    for c in clients.values():
        c.shutdown()
    lines = ["| sessions | path | calls | p50 ms | p95 ms |", "|---:|---|---:|---:|---:|"]
    lines += [
        f"| {r['sessions']} | {r['path']} | {r['calls']} | {r['p50_ms']} | {r['p95_ms']} |"
        for r in rows
    ]
    print("\n".join(lines))
    if args.out:
        command = "python -m bench.serve_hop " + " ".join(
            argv if argv is not None else sys.argv[1:]
        )
        machine = f"{os.cpu_count()} CPUs, torch {torch.__version__}, ray {ray.__version__}"
        doc = {"benchmark": "serve_hop", "command": command, "machine": machine, **git_info()}
        doc["rows"] = rows
        write_json(Path(args.out + ".json"), doc)
        Path(args.out + ".md").write_text(
            f"# Serve hop per chunk\n\n- command: `{command}`\n- machine: {machine}\n\n"
            + "\n".join(lines)
            + "\n"
        )
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    if "ray" in sys.modules:
        sys.modules["ray"].shutdown()
    # at once: Serve's router thread outlives the shutdown, and Ray ends with status 1 a
    # process whose thread calls into it afterwards (tests/serve_cluster_cases.py)
    os._exit(code)
