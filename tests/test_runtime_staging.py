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
from duplexcadence.runtime.engine.staged_int import Affine, StagedInt
from duplexcadence.runtime.engine.staging import StagedUses, _StagedCall
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
        positions = torch.arange(self.pos, self.pos + n, dtype=x.dtype, device=x.device)
        kv = torch.arange(4, device=x.device)
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


# ------------------------------------------------- a sliding window, like transformers'
WINDOW_CONTRACT = """
contract window_demo
clock chunk = 1 per call
clock token = 2 per chunk
region kv {{
  dtype float32
  dims [1, token, 4]
  lifetime turn
  retention window(5 token)
  attended from 0 token by 2 token until 5 token
  site cache["kv"]
}}
callable step {{
  site step
  per chunk
  arg x: float32 [1, 2, 4]
  arg kv: region kv
  counter pos advances 2 from 0{flags}
  retains kv from result[1]
}}
"""


class SlidingWindow:
    """A transformers-style sliding-window step: the kv carry grows 2 tokens a call up to
    the window (5), its positions come from a host counter (``cumulative_length``) and
    the window's first position is ``max(pos + n - kv_length, 0)`` — a plain 0 while the
    window fills, the counter's value once it is full."""

    def __init__(self) -> None:
        self.pos = 0
        self.cache = {"kv": torch.zeros(1, 0, 4)}

    def step(self, x, kv):
        n = x.shape[1]
        positions = torch.arange(self.pos, self.pos + n, dtype=x.dtype)
        full = torch.cat([kv, x + positions[None, :, None]], dim=1)
        first = max(self.pos + n - full.shape[1], 0)
        kv_positions = torch.arange(full.shape[1])
        kv_positions += first
        y = (full * kv_positions[None, :, None].to(x.dtype)).sum(1, keepdim=True)
        self.pos += n
        return y, full

    @torch.no_grad()
    def push(self, x):
        y, full = self.step(x, self.cache["kv"])
        self.cache = {"kv": full[:, -5:]}  # the stock trim: the newest 5 tokens
        return y


def window_stream(flags: str, calls: int = 12):
    result = compile_source(WINDOW_CONTRACT.format(flags=flags), "window_demo.clock")
    assert result.ok, result.diagnostics
    name, _ = import_package(result.files)
    adapter = importlib.import_module(f"{name}.adapter")
    model, ref = SlidingWindow(), SlidingWindow()
    binding = adapter.bind(model, device="cpu", backend="simulate", progress=False)
    same = []
    for i in range(calls):
        x = torch.randn(1, 2, 4, generator=torch.Generator().manual_seed(i))
        same.append(torch.equal(model.push(x), ref.push(x)))
    return binding.stats()["callables"]["step"], all(same)


def test_a_tracking_counter_replays_the_window_past_full_at_every_position():
    # each extent's class is captured where the stream meets it (pos 0, 2, 4, and 6 for
    # the full window), so its host decisions are the stream's and its offsets staged
    step, exact = window_stream(" staged tracks kv")
    assert exact and step["hits"] == 12 and step["misses"] == {}, step


def test_without_tracks_the_full_window_class_is_captured_at_the_wrong_position():
    # the control: every class captured at pos 0, where no class but the first is met,
    # so the guards its host decisions left send those calls eager (exact, counted)
    step, exact = window_stream(" staged")
    assert exact and step["hits"] == 1 and step["misses"] == {"staged_guard": 11}, step
    assert step["miss_details"]["staged_guard"] == (
        "class kv=2: pos - 2 < 0 was True (a comparison (<))"
    )


def test_tracks_turns_an_extent_into_the_calls_that_reach_it():
    from duplexcadence.runtime import Tracks

    t = Tracks("kv", first=0, stride=2, last=5)
    assert [t.calls_to(e) for e in (0, 2, 4, 5)] == [0, 1, 2, 3]  # 5: the first past 4
    assert Tracks("kv", first=302, stride=50, last=402).calls_to(402) == 2
    with pytest.raises(ValueError, match="off its progression"):
        t.calls_to(3)
    c = HostCounter("pos", read=lambda: 0, write=lambda v: None, advances=2, start=1, tracks=t)
    assert c.at_class({"kv": 5}) == 1 + 3 * 2 and c.at_class({}) == 1
