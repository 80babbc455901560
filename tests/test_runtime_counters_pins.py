"""Host counters and pinned regions (runtime/state/counters.py, runtime/state/pins.py) on CPU.

The fake backend re-runs the Python body on "replay"; most tests here use bodies that
do not touch the counter themselves (as a real graph would not): what is checked is
what the engine does around the body. One body advances its own counter, as stock code
does: a replay still moves it once.
"""

from __future__ import annotations

import types

import pytest
import torch

from duplexcadence.runtime import (
    Advance,
    CaptureClass,
    Effect,
    ExactShapeReplay,
    FakeGraphBackend,
    HostCounter,
    Region,
    RegionSpec,
    TensorSpec,
    Tracks,
    pin_at,
    set_replay_enabled,
)
from duplexcadence.runtime.engine.signature import COUNTER_BEFORE_START


@pytest.fixture(autouse=True)
def _reset_controls(monkeypatch):
    monkeypatch.delenv("DUPLEXCADENCE_DISABLE_REPLAY", raising=False)
    yield
    set_replay_enabled(None)


def _engine(state, seen, body=None):
    def observing(x):
        seen.append(state.steps)  # the branch the stock code would take
        return x * 2

    body = body or observing

    counter = HostCounter(
        "state.steps",
        read=lambda: state.steps,
        write=lambda v: setattr(state, "steps", v),
        advances=1,
        start=2,
    )
    return ExactShapeReplay(
        body,
        name="step",
        classes=[CaptureClass("-", (TensorSpec((3,), torch.float32),))],
        regions={},
        declared_effect=Effect.NONE,
        device="cpu",
        backend=FakeGraphBackend(),
        counters=[counter],
    )


@torch.inference_mode()
def test_counter_gates_capture_sees_start_and_replay_advances() -> None:
    state = types.SimpleNamespace(steps=0)
    seen: list[int] = []
    engine = _engine(state, seen).capture_all(progress=False)
    # probe, warm-up and capture all ran at `start`; the caller's value came back
    assert seen and set(seen) == {2}
    assert state.steps == 0

    x = torch.arange(3.0)
    out = engine(x)  # before start: the stock branch differs, so eager
    assert torch.equal(out, x * 2)
    assert engine.misses[COUNTER_BEFORE_START] == 1
    assert state.steps == 0  # eager: the body owns the counter (this one does not)

    state.steps = 2
    out = engine(x)
    assert torch.equal(out, x * 2) and engine.hits == 1
    assert state.steps == 3  # the replay did the body's host work
    engine(x)
    assert state.steps == 4 and engine.hits == 2


def test_counter_rejects_non_int_and_bad_declaration() -> None:
    with pytest.raises(ValueError):
        HostCounter("c", read=lambda: 0, write=lambda v: None, advances=0, start=0)
    bad = HostCounter("c", read=lambda: torch.tensor(1), write=lambda v: None, advances=1, start=0)
    with pytest.raises(TypeError, match="not int"):
        bad.ready()


def test_pin_copies_rebound_value_and_restores_site() -> None:
    state = types.SimpleNamespace(offsets=torch.zeros(1, dtype=torch.long))
    model = types.SimpleNamespace(state=state)
    steps = (("attr", "state"), ("attr", "offsets"))
    region = Region(
        RegionSpec("offsets", torch.long, (1,), None, "session", "mutable"), state.offsets
    )
    pinned = region.tensor
    for i in range(1, 4):
        state.offsets = torch.where(torch.tensor([True]), state.offsets + 1, state.offsets)
        assert state.offsets is not pinned  # the stock code rebinds it
        pin_at(model, steps, region)
        assert state.offsets is pinned and int(pinned) == i
    pin_at(model, steps, region)  # nothing rebound: nothing to do
    assert int(pinned) == 3

    state.offsets = torch.zeros(2, dtype=torch.long)
    with pytest.raises(TypeError, match="pinned region offsets"):
        pin_at(model, steps, region)


@torch.inference_mode()
def test_a_body_that_advances_its_own_counter_is_advanced_once_per_replay() -> None:
    """Stock code advances its counter in the body; a graph would not run that Python, the
    simulate backend does: the counter moves by its declared step once per call either
    way (it moved twice per call, 18 here, before the engine owned the advance)."""
    state = types.SimpleNamespace(steps=2)

    def body(x):
        state.steps += 1  # the stock code's own bookkeeping
        return x * 2

    engine = _engine(state, [], body).capture_all(progress=False)
    assert state.steps == 2  # capture's calls put it back
    for _ in range(8):
        engine(torch.arange(3.0))
    assert engine.hits == 8 and state.steps == 10


@torch.inference_mode()
def test_a_counter_advances_by_the_replayed_class_s_amount() -> None:
    """``counter pos advances w``: a verify call of width w moves a position by w. The
    engine advances it after each replay by the amount of the class it replayed (the
    class name carries w), whatever the body did."""
    state = types.SimpleNamespace(pos=0)

    def body(x):  # a graph runs no Python: this body leaves the counter alone
        return x * 2

    engine = ExactShapeReplay(
        body,
        name="verify",
        classes=[CaptureClass(f"w={w}", (TensorSpec((1, w), torch.float32),)) for w in (1, 2, 3)],
        regions={},
        declared_effect=Effect.NONE,
        device="cpu",
        backend=FakeGraphBackend(),
        counters=[
            HostCounter(
                "state.pos",
                read=lambda: state.pos,
                write=lambda v: setattr(state, "pos", v),
                advances=Advance("w", {1: 1, 2: 2, 3: 3}),
                start=0,
            )
        ],
    ).capture_all(progress=False)
    assert state.pos == 0
    for w in (3, 1, 2, 2):
        engine(torch.ones(1, w))
    assert engine.hits == 4 and state.pos == 8
    shown = engine.stats()["counters"]["state.pos"]["advances"]
    assert shown == {"by": "w", "amounts": {"1": 1, "2": 2, "3": 3}}


def test_a_per_value_advance_refuses_a_bad_declaration() -> None:
    with pytest.raises(ValueError, match=">= 1"):
        Advance("w", {1: 0})
    with pytest.raises(KeyError, match="names no value of w"):
        Advance("w", {1: 1}).of_class("n=1")
    tracks = Tracks("kv", first=0, stride=1, last=4)
    with pytest.raises(ValueError, match="one amount"):
        HostCounter("c", lambda: 0, lambda v: None, Advance("w", {1: 1}), 0, tracks=tracks)


COUNTED = """
contract counted
clock round = 1 per call
callable verify {
  site verify
  per round
  arg x: float32 [1, w]
  config w in {1, 2, 3}
  counter pos advances w from 0
}
"""


class Verifier:
    """Stock code that moves a host position by the width it verified."""

    def __init__(self) -> None:
        self.pos = 0

    def verify(self, x):
        self.pos += x.shape[1]
        return x * 2


@torch.inference_mode()
def test_a_contract_s_counter_advances_by_a_config_variable() -> None:
    from fuzzing import compile_source, compiled_adapter

    generated = compile_source(COUNTED, "counted.clock").files
    assert any('advances=Advance("w", {1: 1, 2: 2, 3: 3})' in t for t in generated.values())
    model, stock = Verifier(), Verifier()
    binding = compiled_adapter(COUNTED, "counted.clock").bind(
        model, device="cpu", backend="simulate", progress=False
    )
    for w in (2, 3, 1, 3):
        x = torch.full((1, w), float(w))
        assert torch.equal(model.verify(x), stock.verify(x))
    assert model.pos == stock.pos == 9
    assert binding.stats()["callables"]["verify"]["hits"] == 4
