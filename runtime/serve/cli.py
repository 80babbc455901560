"""``duplexcadence-serve CONTRACT --model pkg.mod:fn``: the application in one command.

Starts an embedded Ray cluster on this machine (or joins ``--address``), runs the
application (launch.py) with ``--replicas`` replicas of ``--gpus-per-replica`` GPUs each (0:
the CPU), and serves the WebSocket ``ws://HOST:PORT/sessions`` until interrupted. The
defaults work on one CPU machine; on a GPU host give every replica a GPU and take
``--max-sessions`` from ``clockc plan CONTRACT --profile ... --lanes K``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from .config import TRANSPORTS, ServeConfig


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="duplexcadence-serve", description=__doc__.split("\n")[0])
    p.add_argument("contract", help="generated adapter package, e.g. duplexcadence.generated.x")
    p.add_argument("--model", required=True, help="package.module:function -> ServedModel")
    p.add_argument("--replicas", type=int, default=1, help="replicas (one per GPU)")
    p.add_argument("--gpus-per-replica", type=float, default=0.0)
    p.add_argument(
        "--cpus-per-replica",
        type=float,
        default=0.0,
        help="Ray CPUs per replica: also its OMP/torch threads (Ray sets 1 for 0)",
    )
    p.add_argument(
        "--transport",
        choices=TRANSPORTS,
        default="actor",
        help="how the ingress's calls reach a replica: a Ray actor call or Serve's gRPC",
    )
    p.add_argument("--lanes", type=int, default=1, help="replay lanes per replica")
    p.add_argument("--max-sessions", type=int, default=4, help="sessions per replica")
    p.add_argument(
        "--restore-calls",
        type=int,
        default=0,
        metavar="N",
        help="rebuild a dead replica's session on another one by replaying its calls, "
        "while it has made at most N (0: it is lost)",
    )
    p.add_argument(
        "--idle-timeout-s",
        type=float,
        default=None,
        metavar="S",
        help="close a session with no call for S seconds, freeing its place (default: never)",
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--address", help="a running Ray cluster to join (default: start one)")
    p.add_argument("--num-cpus", type=int, help="CPUs of the embedded Ray cluster")
    p.add_argument("--name", default="duplexcadence", help="Serve application name")
    p.add_argument(
        "--route-prefix", default="/", help="HTTP route of the application (one per app)"
    )
    return p.parse_args(argv)


def config_of(args: argparse.Namespace) -> ServeConfig:
    return ServeConfig(
        contract=args.contract,
        model=args.model,
        replicas=args.replicas,
        gpus_per_replica=args.gpus_per_replica,
        cpus_per_replica=args.cpus_per_replica,
        lanes=args.lanes,
        max_sessions=args.max_sessions,
        name=args.name,
        transport=args.transport,
        restore_calls=args.restore_calls,
        idle_timeout_s=args.idle_timeout_s,
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        config = config_of(args)
    except ValueError as e:
        print(f"duplexcadence-serve: {e}", file=sys.stderr)
        return 2
    from . import ray_missing

    if (hint := ray_missing()) is not None:
        print(f"duplexcadence-serve: {hint}", file=sys.stderr)
        return 2
    import ray

    from .launch import init_local, start

    if args.address:
        ray.init(address=args.address)
    else:
        init_local(num_cpus=args.num_cpus, paths=(os.getcwd(),))
    start(config, http_port=args.port, host=args.host, route_prefix=args.route_prefix)
    print(
        f"duplexcadence-serve: {config.replicas} replica(s) of {config.contract} up; "
        f"sessions at ws://{args.host}:{args.port}/sessions (Ctrl-C stops)",
        flush=True,
    )
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        from ray import serve

        if args.address:  # a cluster we joined keeps running: take only our application
            serve.delete(config.name)
        ray.shutdown()  # the embedded cluster goes with its Serve instance
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
