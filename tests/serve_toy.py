"""The toy streaming model of toy_stream.py as a served contract and model, for the Ray
Serve tests (tests/test_serve.py, tests/serve_cluster_cases.py): ``duplexcadence-serve
serve_toy --model serve_toy:served``. ``bind`` stands in for a generated adapter's (the
fake graph backend: admission and replay run on the CPU). ``TOY`` is the tests' config
(two replicas of two sessions) and ``exact`` their check of a session's outputs."""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import torch
from toy_stream import Net, Stream, decl, solo_stock

from duplexcadence.runtime import FakeGraphBackend, bind_contract
from duplexcadence.runtime.serve import ServeConfig, ServedModel

TOY = ServeConfig("serve_toy", "serve_toy:served", replicas=2, max_sessions=2)


def exact(got: list, seed: int, reset_at: tuple[int, ...] = ()) -> bool:
    """``got`` (a session's outputs as arrays) equals the session run alone on stock code."""
    want = solo_stock(seed, len(got), reset_at)
    return all(np.array_equal(a, b.numpy()) for a, b in zip(got, want))


def bind(model: Any, *, device: Any = None, capture: bool = True, progress: bool = True, **kw):
    kw.setdefault("backend", FakeGraphBackend())
    return bind_contract(model, decl(), device=device, capture=capture, progress=progress, **kw)


def build(device: Any, bind: Any) -> Stream:
    return Stream(Net(device), seed=99)


def open_session(model: Stream, pool: Any, params: dict) -> Any:
    """A session of the toy stream seeded ``params["seed"]`` (its prompt), primed."""
    seed = int(params["seed"])
    obj = copy.copy(model)
    obj.prompt = Stream(model.net, seed).prompt
    obj.prime()
    session = pool.open(obj, seed=seed)
    session.mark_turn_start()
    return session


def step(session: Any, x: Any) -> Any:
    """One chunk; ``x`` a (3, 8) float32 tensor, or its nested list (a WebSocket client's
    JSON: float32 values survive the round trip through JSON numbers exactly)."""
    x = torch.as_tensor(x, dtype=torch.float32, device=session.obj.net.w.device)
    return session.run(session.obj.chunk, x).cpu().numpy()


def served() -> ServedModel:
    return ServedModel(build=build, open=open_session, step=step)
