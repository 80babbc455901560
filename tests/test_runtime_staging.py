"""Staged counters (runtime/engine/staging.py): a host int the body derives tensors from
(transformers' ``cumulative_length`` -> rotary positions, mask offsets) reaches the graph
through device buffers, so replays at any counter value give the stock bytes; what a
staged value decides that no buffer can carry is a guard that sends the replay eager."""

import importlib

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from duplexcadence.compiler.driver import compile_source
from duplexcadence.runtime import CaptureClass, ExactShapeReplay, FakeGraphBackend, TensorSpec
from duplexcadence.runtime.engine.staging import Affine, StagedInt, StagedUses, _StagedCall
from duplexcadence.runtime.state.counters import HostCounter
from fuzzing import import_package


class Positions:
    """Rotary-style positions and a mask offset from a host counter, as transformers'
    caches make them (``arange(past, past + n)``, ``kv_arange += offset``)."""

    def __init__(self, window: int = 1000) -> None:
        self.pos = 0
        self.window = window

    def step(self, x):
        n = x.shape[0]
        positions = torch.arange(self.pos, self.pos + n, dtype=x.dtype)
        kv = torch.arange(4)
        kv += max(self.pos - self.window, 0)  # 0 until the window is full
        self.pos += n
        return x * 2 + positions[:, None] + kv.to(x.dtype)


class Sliced:
    """A counter used as an index: a graph would read the capture's column."""

    def __init__(self) -> None:
        self.pos = 0

    def step(self, x):
        out = x * x[:, self.pos % 4 : self.pos % 4 + 1]
        self.pos += 3
        return out


def engine(model, staged: bool, device: str = "cpu"):
    counter = HostCounter(
        "pos",
        read=lambda: model.pos,
        write=lambda v: setattr(model, "pos", v),
        advances=3,
        start=0,
        staged=staged,
    )
    cls = CaptureClass("T", (TensorSpec((3, 4), torch.float32, "randn"),), {})
    backend = FakeGraphBackend() if device == "cpu" else None
    return ExactShapeReplay(
        model.step, name="step", classes=[cls], regions={}, write_through={}, device=device,
        backend=backend, counters=[counter],
    ).capture_all(progress=False)  # fmt: skip


def stream(model_type, staged, calls=12, device="cpu", **kw):
    """(the engine, whether every output equals the stock model's, bit for bit)."""
    m, ref = model_type(**kw), model_type(**kw)
    eng = engine(m, staged, device)
    same = []
    with torch.no_grad():
        for i in range(calls):
            x = torch.randn(3, 4, generator=torch.Generator().manual_seed(i)).to(device)
            same.append(torch.equal(eng(x), ref.step(x)))
    assert m.pos == ref.pos  # the counter advanced once per call, replay or not
    return eng, all(same)


def test_a_staged_counter_replays_every_call_with_the_live_positions():
    eng, exact = stream(Positions, staged=True)
    assert exact and eng.hits == 12 and not eng.misses and eng.rejected is None
    [e] = eng._entries
    # two uses: the positions' arange and the offset's add (0 here, but the counter's)
    assert [u.kind for u in e.stage_uses.uses] == ["arange"]


def test_the_same_counter_not_staged_is_refused_at_capture_naming_it():
    # the control: without `staged` a graph would bake the capture's positions; capture
    # finds the counter feeding a tensor and refuses the callable, on every backend
    eng, exact = stream(Positions, staged=False)
    assert exact and eng.hits == 0 and eng.rejected == "stale_host_value"
    why = eng.rejected_detail
    assert "counter pos feeds arange (pos = 0)" in why and "declare it `counter pos" in why
    assert "test_runtime_staging.py" in why  # the model's line


def test_a_mask_offset_past_the_window_replays_once_it_follows_the_counter():
    # captured at pos 0, the offset is max(pos - 4, 0) = 0: a plain int the graph bakes,
    # so once the window is full the guard sends the replay eager, naming why
    eng, exact = stream(Positions, staged=True, window=4)
    assert exact
    assert eng.hits == 2 and eng.misses["staged_guard"] == 10
    assert "pos - 4 < 0 was True (a comparison (<))" in eng.miss_details["staged_guard"]


def test_a_counter_used_as_an_index_is_a_guard_not_a_wrong_answer():
    eng, exact = stream(Sliced, staged=True)
    assert exact
    assert eng.hits >= 1 and eng.misses["staged_guard"] >= 1
    assert "pos == 0 was True (%)" in eng.miss_details["staged_guard"]


# ------------------------------------------------------------------ the arithmetic
def call(values=(7,)):
    return _StagedCall(StagedUses(("c",), (True,)), list(values), making=True)


@given(st.integers(-1000, 1000), st.integers(-50, 50), st.integers(-50, 50))
def test_arithmetic_keeps_the_affine_form_and_its_value(c, k, m):
    s = StagedInt(c, Affine(0, 1, 0), call((c,)))
    for value, a, b in [
        (s + k, 1, k),
        (k + s, 1, k),
        (s - k, 1, -k),
        (k - s, -1, k),
        (s * m + k, m, k),
        (-s, -1, 0),
    ]:
        if a * c + b == value and isinstance(value, StagedInt):
            assert value.form == Affine(0, a, b)
        assert int(value) == a * c + b
    # the counter cancels out: a plain int again (a length, not a position)
    length = (s + k) - s
    assert type(length) is int and length == k


def test_comparisons_and_indices_become_guards():
    c = call()
    s = StagedInt(7, Affine(0, 1, 0), c)
    assert (s > 3) is True and max(s - 9, 0) == 0
    # (max compares 0 > c - 9, which Python asks the int subclass as c - 9 < 0)
    assert [g.show(("c",)) for g in c.uses.guards] == [
        "c > 3 was True (a comparison (>))",
        "c - 9 < 0 was True (a comparison (<))",
    ]
    assert all(g.holds([7]) for g in c.uses.guards)
    assert not all(g.holds([12]) for g in c.uses.guards)  # past 9 the max picks the other


# ------------------------------------------------------------------ from a contract
CONTRACT = """
contract staged_demo
clock frame = 1 per call
callable step {
  site step
  per frame
  arg x: float32 [3, 4]
  counter pos advances 3 from 0 staged
}
"""


def test_a_contract_declares_a_staged_counter_and_its_binding_replays_exactly():
    result = compile_source(CONTRACT, "staged_demo.clock")
    assert result.ok, result.diagnostics
    assert 'Counter("pos", advances=3, start=0, staged=True)' in result.files["contract.py"]
    name, _ = import_package(result.files)
    adapter = importlib.import_module(f"{name}.adapter")
    model, ref = Positions(), Positions()
    binding = adapter.bind(model, device="cpu", backend="simulate", progress=False)
    with torch.no_grad():
        for i in range(10):
            x = torch.randn(3, 4, generator=torch.Generator().manual_seed(i))
            assert torch.equal(model.step(x), ref.step(x)), i
    step = binding.stats()["callables"]["step"]
    assert step["hits"] == 10 and step["misses"] == {}, step


@pytest.mark.cuda
def test_staged_positions_replay_exactly_on_cuda():
    eng, exact = stream(Positions, staged=True, calls=20, device="cuda")
    assert eng.backend.name == "cuda_graph"
    assert exact and eng.hits == 20 and not eng.misses
