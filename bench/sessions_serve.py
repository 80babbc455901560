"""Token2Wav sessions through the Ray Serve application (runtime/serve), for the cadence
harness: ``python -m bench.cadence --workload bench.sessions_serve``.

The sessions, their inputs and their reference are those of bench/sessions_token2wav.py
(same workload name, the same seeded tokens, voices and device random streams, each
session's bytes against its solo run on ``stock_procs``); what changes is the server:

* ``serve_gpus_1`` / ``serve_gpus_2`` — ``RayServer``: the worker process is the
  client. It starts an embedded Ray cluster and the application (one replica per GPU,
  each one binding of ``stepaudio2_token2wav`` with ``lanes`` replay lanes, at most
  ``max_sessions`` sessions, each with the worker's torch threads), then every
  client thread opens its session through the ingress and sends its chunks and resets
  straight to the session's replica (``SessionClient``: one Ray hop per chunk). Its
  latency is arrival to PCM back in the client, Ray's hop included.
* ``serve_gpus_1_grpc`` — ``serve_gpus_1`` with the client's chunks on Serve's gRPC
  transport (``SessionClient(transport="grpc")``) instead of Ray actor calls.
* ``serve_gpus_1_ingress`` — ``serve_gpus_1`` through the ingress handle (client -> ingress ->
  replica and back: two hops per chunk, what a WebSocket client's chunk crosses).
* ``adapter_lanes`` — the same pool in process (sessions_token2wav), the baseline of the
  Ray path's added latency.
* ``serve_gpus_2_kill`` / ``serve_gpus_1_kill`` — ``serve_gpus_2``, or two replicas on
  one GPU, whose replica 0 is killed ``kill_replica_at_s`` after the first session opens;
  the client keeps every session's calls (``restore_calls``) and the ingress rebuilds
  the killed replica's sessions on the survivor, so every session must still equal its
  solo stock run. The run's server stats carry the kill time and the restores; the
  chunk latencies show the stall.

``token2wav()`` is the ServedModel the replicas load (``--model
bench.sessions_serve:token2wav``). ``python -m bench.sessions_serve summarise JSON`` adds
the top-level ``gpus_1``/``gpus_2`` records (and the Ray path's added p95) to a sweep's
JSON; the sweep rewrites its JSON, so run it after every sweep or ``--resume``.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch

from duplexcadence.runtime.serve import ServeConfig, ServedModel

from bench.cadence import Arm, Chunk, SessionSpec, SessionWorkload
from bench.harness.process import write_json
from bench.sessions_token2wav import (
    CONTRACT,
    MODEL_SEED,
    SESSIONS as T2W,
    chunk_tokens,
    open_pooled,
    session_tokens,
    Voice,
    voice_of,
)
from bench.workloads import token2wav as W

LANES = 8  # per replica: the in-process arm's lanes (bench/results/sessions_h200)
MAX_SESSIONS = 64  # per replica, above the 44 measured at cadence: misses mark the limit
KILL_AT_S = 20  # the kill arms: replica 0 dies this long after the first session opens
# a 60 s run makes about 60 chunks and resets per session: every one stays restorable
KILL = {"kill_replica_at_s": KILL_AT_S, "restore_calls": 256}


# ------------------------------------------------------------ replica side
def _build(device: Any, bind: Any) -> Any:
    return W.build_token2wav(seed=MODEL_SEED, device=device, before_priming=bind)


def _open(t2w: Any, pool: Any, params: dict) -> Any:
    voice = Voice(int(params["voice"]), int(params.get("frames", W.PROMPT_FRAMES)))
    return open_pooled(pool, t2w, voice, int(params["seed"]))


def _step(session: Any, payload: dict) -> Any:
    with torch.inference_mode():
        return session.run(W.stream_chunk, session.obj, payload["tokens"], payload["last_chunk"])


def token2wav() -> ServedModel:
    """Token2Wav 1.0.6 (seeded random weights) as a served model: params ``{"voice",
    "seed"}`` and optionally ``"frames"`` (the voice prompt's length, 50..600), payload ``{"tokens": 28 ids, "last_chunk": bool}``, output float32 PCM.
    """
    return ServedModel(build=_build, open=_open, step=_step)


# ------------------------------------------------------------- client side
class RayServer:
    """The cadence harness's server protocol over the application: through a
    ``SessionClient`` (one hop per chunk) or, with ``via="ingress"``, the ingress handle."""

    def __init__(self, arm: Arm, device: torch.device) -> None:
        from duplexcadence.runtime.serve import SessionClient
        from duplexcadence.runtime.serve.launch import init_local, start

        gpus = int(arm.options["gpus"])
        replicas = int(arm.options.get("replicas", gpus))  # more than one per GPU: shared
        cuda = torch.device(device).type == "cuda"
        threads = torch.get_num_threads()  # the in-process arm's (``--threads``, if given)
        self.config = ServeConfig(
            contract=f"duplexcadence.generated.{CONTRACT}",
            model="bench.sessions_serve:token2wav",
            replicas=replicas,
            gpus_per_replica=gpus / replicas if cuda else 0.0,
            # Ray makes a replica's CPUs its OMP/torch threads (1 if none): as many as
            # this worker process (the in-process arm) has
            cpus_per_replica=threads if cuda else 0.0,
            lanes=int(arm.options.get("lanes", LANES)) if cuda else 1,
            max_sessions=int(arm.options.get("max_sessions", MAX_SESSIONS)),
            stall_s=60.0,  # a replica busy capturing is slow, not dead
            restore_calls=int(arm.options.get("restore_calls", 0)),
        )
        init_local(
            num_cpus=(
                max(replicas * threads + 1, os.cpu_count() or 2) if cuda else max(2, replicas * 2)
            ),
            object_store_mib=256,
            paths=(Path(__file__).resolve().parents[1],),
            shared_host=not cuda,  # a CPU host here is shared by other programs
            log_to_driver=False,
        )
        self.handle = start(self.config)
        self._wait_up(timeout_s=900)
        self.client = SessionClient(
            self.config.name,
            transport=str(arm.options.get("transport", "actor")),
            restore_calls=self.config.restore_calls,
        )
        self.via_ingress = arm.options.get("via") == "ingress"
        self.kill_at_s = arm.options.get("kill_replica_at_s")
        self.killed_at: float | None = None  # epoch seconds
        self._killer: threading.Thread | None = None
        self._killer_lock = threading.Lock()

    def _kill_later(self) -> None:
        """Kill replica 0's actor ``kill_at_s`` after the first session opened."""
        import ray

        time.sleep(float(self.kill_at_s))
        victim = next(
            a["name"]
            for a in ray.util.list_named_actors(all_namespaces=True)
            if f"{self.config.name}#replica_0#" in a["name"]
        )
        ray.kill(ray.get_actor(victim, namespace="serve"), no_restart=True)
        self.killed_at = time.time()
        print(f"bench.sessions_serve: killed {victim}", file=sys.stderr, flush=True)

    def _wait_up(self, timeout_s: float) -> None:
        t = time.time()
        while time.time() - t < timeout_s:
            if all(r["up"] for r in self.handle.stats.remote().result()["replicas"]):
                return
            time.sleep(0.5)
        raise TimeoutError(f"replicas not up within {timeout_s:.0f} s")

    def open(self, spec: SessionSpec) -> dict:
        if self.kill_at_s is not None:
            with self._killer_lock:
                if self._killer is None:
                    self._killer = threading.Thread(target=self._kill_later, daemon=True)
                    self._killer.start()
        voice = voice_of(spec)
        sid = self.client.open({"voice": voice.seed, "frames": voice.frames, "seed": spec.seed})
        return {"sid": sid, "tokens": session_tokens(spec)}

    def submit(self, s: dict, chunk: Chunk) -> dict:
        payload = {"tokens": chunk_tokens(s["tokens"], chunk), "last_chunk": chunk.last_in_turn}
        if self.via_ingress:
            return {"pcm": self.handle.chunk.remote(s["sid"], payload).result()}
        return {"pcm": self.client.chunk(s["sid"], payload)}

    def reset(self, s: dict) -> None:
        if self.via_ingress:
            self.handle.reset.remote(s["sid"]).result()
        else:
            self.client.reset(s["sid"])

    def close(self, s: dict) -> None:
        self.client.close(s["sid"])

    def stats(self) -> dict:
        via = "ingress" if self.via_ingress else "client"
        killed = {"killed_replica_0_at": self.killed_at} if self.kill_at_s is not None else {}
        return {"config": vars(self.config), "via": via, **killed, **self.client.stats()}

    def reset_peak_memory(self) -> None:
        self.handle.reset_peak_memory.remote().result()

    def peak_mib(self) -> float | None:
        """The replicas' device peaks since ``reset_peak_memory()``, summed; None on a
        CPU or where a replica gave none (it died in the window)."""
        memory = [
            (r.get("server") or {}).get("device_memory") for r in self.client.stats()["replicas"]
        ]
        return None if not memory or None in memory else sum(m["peak_mib"] for m in memory)


def server(arm: Arm, device: Any) -> Any:
    return RayServer(arm, device) if "gpus" in arm.options else T2W.server(arm, device)


SESSIONS = SessionWorkload(
    name=T2W.name,
    arms=(
        T2W.arm("stock_procs"),
        T2W.arm("adapter_lanes"),
        Arm(
            "serve_gpus_1",
            "inproc",
            f"Ray Serve: one replica (1 GPU, {LANES} lanes), chunks straight to it",
            options={"gpus": 1, "lanes": LANES},
        ),
        Arm(
            "serve_gpus_1_ingress",
            "inproc",
            f"Ray Serve: one replica (1 GPU, {LANES} lanes), chunks through the ingress",
            options={"gpus": 1, "lanes": LANES, "via": "ingress"},
        ),
        Arm(
            "serve_gpus_1_grpc",
            "inproc",
            f"Ray Serve: one replica (1 GPU, {LANES} lanes), chunks straight to it by gRPC",
            options={"gpus": 1, "lanes": LANES, "transport": "grpc"},
        ),
        Arm(
            "serve_gpus_2",
            "inproc",
            f"Ray Serve: two replicas (1 GPU, {LANES} lanes each), chunks straight to them",
            options={"gpus": 2, "lanes": LANES},
        ),
        Arm(
            "serve_gpus_2_kill",
            "inproc",
            f"serve_gpus_2 with replica 0 killed {KILL_AT_S} s in, its sessions restored "
            "on replica 1 from the client's journals",
            options={"gpus": 2, "lanes": LANES, **KILL},
        ),
        Arm(
            "serve_gpus_1_kill",
            "inproc",
            f"two replicas sharing one GPU ({LANES // 2} lanes each), replica 0 killed "
            f"{KILL_AT_S} s in, its sessions restored on replica 1",
            options={"gpus": 1, "replicas": 2, "lanes": LANES // 2, **KILL},
        ),
    ),
    reference=T2W.reference,
    streams=T2W.streams,
    server=server,
    base_env=T2W.base_env,
)


# ---------------------------------------------------------------- summary
def _at(doc: dict, arm: str, n: Any) -> dict:
    return doc.get("per_n", {}).get(arm, {}).get(str(n), {}) if n is not None else {}


ONE_GPU_PATHS = ("serve_gpus_1", "serve_gpus_1_grpc", "serve_gpus_1_ingress")


def _added_p95(doc: dict, arm: str) -> dict:
    """{N: the arm's p95 less the in-process pool's} at every N both ran."""
    common = sorted(
        set(doc.get("per_n", {}).get(arm, {})) & set(doc.get("per_n", {}).get("adapter_lanes", {})),
        key=int,
    )
    return {
        n: round(_at(doc, arm, n)["p95_ms"] - _at(doc, "adapter_lanes", n)["p95_ms"], 3)
        for n in common
        if _at(doc, arm, n).get("p95_ms") is not None
        and _at(doc, "adapter_lanes", n).get("p95_ms") is not None
    }


def summarise(doc: dict) -> dict:
    """``gpus_1``/``gpus_2`` (the serve arms: largest N at cadence, p95 at that N,
    every hashed session exact) and the Ray path's added p95 over the in-process pool
    at the same N on one GPU."""
    out = {}
    for key, arm in (("gpus_1", "serve_gpus_1"), ("gpus_2", "serve_gpus_2")):
        a = doc.get("arms", {}).get(arm, {})
        best = a.get("max_sessions_at_cadence")
        out[key] = {
            "max_sessions_at_cadence": best,
            "p95_ms": _at(doc, arm, best).get("p95_ms"),
            "all_sessions_exact": a.get("all_sessions_exact"),
            "arm": arm,
        }
    g1, g2 = out["gpus_1"]["max_sessions_at_cadence"], out["gpus_2"]["max_sessions_at_cadence"]
    out["scaling_2_over_1"] = round(g2 / g1, 3) if g1 and g2 else None
    out["ray_added_p95_ms"] = _added_p95(doc, "serve_gpus_1")
    # every one-GPU path (the client by actor call or gRPC, the ingress), for comparison
    out["ray_added_p95_ms_by_arm"] = {
        arm: _added_p95(doc, arm) for arm in ONE_GPU_PATHS if doc.get("per_n", {}).get(arm)
    }
    out["replica_killed"] = {arm: _killed(doc, arm) for arm in KILL_ARMS if doc.get("per_n", {}).get(arm)}  # fmt: skip
    return out


KILL_ARMS = ("serve_gpus_2_kill", "serve_gpus_1_kill")


def _killed(doc: dict, arm: str) -> dict:
    """{N: what a replica's death cost} for a kill arm: every session exact or not, the
    misses and worst latency around it, and the restores the ingress made."""
    out = {}
    for n, p in sorted(doc.get("per_n", {}).get(arm, {}).items(), key=lambda kv: int(kv[0])):
        run = next(  # the point's run, which keeps its workers' results (server stats)
            (r for r in doc.get("runs", []) if (r.get("arm"), str(r.get("n"))) == (arm, n)),
            {},
        )
        server = next((w.get("server") or {} for w in run.get("workers") or []), {})
        out[n] = {
            "status": p.get("status"),
            "all_sessions_exact": bool(p.get("sessions_hashed"))
            and p.get("sessions_exact") == p.get("sessions_hashed"),
            "sessions_hashed": p.get("sessions_hashed"),  # those with a solo reference
            "misses": p.get("misses"),
            "p95_ms": p.get("p95_ms"),
            "max_ms": p.get("max_ms"),
            "killed_at": server.get("killed_replica_0_at"),
            "restores": server.get("restores"),
        }
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] != "summarise":
        print("usage: python -m bench.sessions_serve summarise RESULTS.json", file=sys.stderr)
        return 2
    path = Path(argv[1])
    doc = json.loads(path.read_text())
    doc.update(summarise(doc))
    write_json(path, doc)
    print(json.dumps({k: doc[k] for k in ("gpus_1", "gpus_2", "scaling_2_over_1", "ray_added_p95_ms")}, indent=1))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
