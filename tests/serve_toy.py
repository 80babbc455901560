"""The toy streaming model of toy_stream.py as a served contract and model, for the Ray
Serve tests (tests/test_serve.py): ``duplexcadence-serve serve_toy --model
serve_toy:served``. ``bind`` stands in for a generated adapter's (the fake graph
backend: admission and replay run on the CPU)."""

from __future__ import annotations

import copy
from typing import Any

import torch
from toy_stream import Net, Stream, decl

from duplexcadence.runtime import FakeGraphBackend, bind_contract
from duplexcadence.runtime.serve import ServedModel


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
    x = torch.as_tensor(x, dtype=torch.float32)
    return session.run(session.obj.chunk, x).numpy()


def served() -> ServedModel:
    return ServedModel(build=build, open=open_session, step=step)
