"""host_program.py and the simulate backend: a host value a real CUDA graph would have
frozen fails on the CPU, named (issue 23: simulate passed what a real graph breaks)."""

from __future__ import annotations

import pytest
import torch

from duplexcadence.runtime import (
    CaptureClass,
    ExactShapeReplay,
    FakeGraphBackend,
    ReplayMiss,
    TensorSpec,
    strict,
)
from duplexcadence.runtime.engine.host_program import record, run_checked


class Steady:
    """State in a buffer the call writes in place: what a graph replays correctly."""

    def __init__(self) -> None:
        self.acc = torch.zeros(4)

    def step(self, x):
        self.acc.add_(x.sum(0))
        return x * 2 + self.acc


class Positions:
    """Positions from a host offset (transformers' ``cumulative_length``): a graph bakes
    the capture's positions."""

    def __init__(self) -> None:
        self.offset = 0

    def step(self, x):
        pos = torch.arange(self.offset, self.offset + x.shape[0], dtype=x.dtype)
        self.offset += x.shape[0]
        return x + pos[:, None]


class Rebinds:
    """A state tensor rebound on the object each call: a graph reads the old address."""

    def __init__(self) -> None:
        self.state = torch.zeros(4)

    def step(self, x):
        self.state = self.state + x.sum(0)
        return x * self.state


class Branches:
    """A host branch on a Python counter: a graph replays the branch of its capture."""

    def __init__(self) -> None:
        self.calls = 0

    def step(self, x):
        self.calls += 1
        return x + 1 if self.calls % 2 else x.neg()


class FromHost:
    """A tensor made from host data each call: a graph bakes its values."""

    def __init__(self) -> None:
        self.k = 1

    def step(self, x):
        self.k += 1
        return x * torch.tensor([float(self.k)])


def engine(model):
    cls = CaptureClass("T", (TensorSpec((3, 4), torch.float32, "randn"),), {})
    wt = {"acc": lambda: model.acc} if hasattr(model, "acc") else {}
    return ExactShapeReplay(
        model.step, name="step", classes=[cls], regions={}, write_through=wt, device="cpu",
        backend=FakeGraphBackend(),
    ).capture_all(progress=False)  # fmt: skip


def x_of(i):
    return torch.randn(3, 4, generator=torch.Generator().manual_seed(i))


def test_a_call_whose_host_side_does_not_change_replays():
    m, ref = Steady(), Steady()
    eng = engine(m)
    ref.step(x_of(99))  # the capture call ran once (the fake backend's capture is eager)
    ref.acc.zero_(), m.acc.zero_()
    with torch.no_grad():
        for i in range(4):
            assert torch.equal(eng(x_of(i)), ref.step(x_of(i)))
    assert eng.hits == 4 and eng.rejected is None


@pytest.mark.parametrize(
    "model, says",
    [
        (Positions, "aten.arange.start"),
        (Rebinds, "at capture"),
        (Branches, "a host branch taken another way"),
        (FromHost, "made from host data"),
    ],
)
def test_a_host_value_a_graph_would_freeze_takes_the_callable_out_of_replay(model, says):
    m = model()
    eng = engine(m)
    at_capture = eng.backend.eager_runs + eng.backend.captures  # the probe and the capture
    with torch.no_grad():
        outs = [eng(x_of(i)) for i in range(3)]
    assert eng.rejected == "stale_host_value" and eng.hits == 0
    assert eng.misses["stale_host_value"] == 3  # found at the first, out of replay after
    detail = eng.miss_details["stale_host_value"]
    assert says in detail and "test_runtime_host_program.py" in detail  # the model's line
    if model is not Rebinds:  # (its state depends on the capture's random inputs)
        # what the caller got is an eager call's, every time: the body ran, nothing baked
        ref = model()
        for _ in range(at_capture):
            ref.step(x_of(99))
        assert all(torch.equal(o, ref.step(x_of(i))) for i, o in enumerate(outs))


def test_capture_names_both_values_before_any_replay():
    # found at capture, on every backend: the capture call against the eager call before
    # it (on CUDA, where no replay re-runs the body, this is the only place to see it)
    m = Positions()
    eng = engine(m)
    at_capture = m.offset - 3  # the capture call was the last to run the body
    assert eng.rejected == "stale_host_value" and eng.backend.replays == 0
    text = eng.rejected_detail
    assert (
        f"argument 0: {at_capture} at capture, {at_capture - 3} in the eager call before it" in text
    ), text
    with torch.no_grad():
        eng(x_of(0))
    assert eng.miss_details["stale_host_value"] == text  # every eager call says why


def test_strict_mode_raises_at_the_stale_value():
    eng = engine(Positions())
    with torch.no_grad(), strict(), pytest.raises(ReplayMiss, match="stale_host_value"):
        eng(x_of(0))


def test_record_and_check_directly():
    m, x = Positions(), x_of(0)  # a graph's inputs are static: one tensor
    _, program = record(m.step, (x,), {})
    m.offset = 0
    _, same = run_checked(m.step, (x,), {}, program)
    assert same is None  # the same offset: the same host side
    _, moved = run_checked(m.step, (x,), {}, program)
    assert moved is not None and "aten.arange" in moved
    m.offset = 0
    _, elsewhere = run_checked(m.step, (x.clone(),), {}, program)
    assert "at 0x" in elsewhere  # another input address than the capture's


def test_fewer_ops_than_the_capture_is_a_difference():
    def step(x, n):
        for _ in range(n):
            x = x + 1
        return x

    x = torch.ones(2)
    _, program = record(step, (x, 3), {})
    _, diff = run_checked(step, (x, 2), {}, program)
    assert diff is not None and "the call now ran 2 ops, the call at capture 3" in diff


def test_verify_never_accepts_a_stale_host_value():
    from duplexcadence.runtime.tools.verify import Verdict

    why = "class T: op #0 aten.arange.start, argument 0: 6 now, 3 at capture"
    replay = {"calls": 5, "hits": 2, "misses": {"stale_host_value": 3},
              "miss_details": {"stale_host_value": why}}  # fmt: skip
    v = Verdict("c", "cpu", "simulate", 5, compared=5, replay={"step": replay}, allow_eager=True)
    assert not v.ok and v.stale_host_values == {"step": why}
    assert "a graph would replay a stale host value" in v.describe() and why in v.describe()
    replay["misses"] = {}
    assert v.ok  # the same run without it verifies


def test_capture_leaves_undeclared_host_state_as_it_found_it():
    # the probe, warm-up and capture calls run the body three times: an offset it advances
    # (not declared) must not start the caller's stream three calls late
    import importlib

    from duplexcadence.compiler.driver import compile_source
    from fuzzing import import_package

    contract = (
        "contract positions\nclock frame = 1 per call\n"
        "callable step {\n  site step\n  per frame\n  arg x: float32 [3, 4]\n}\n"
    )
    result = compile_source(contract, "positions.clock")
    assert result.ok, result.diagnostics
    name, _ = import_package(result.files)
    adapter = importlib.import_module(f"{name}.adapter")
    model, ref = Positions(), Positions()
    binding = adapter.bind(model, device="cpu", backend="simulate", progress=False)
    assert model.offset == 0  # put back after capture (it was 9)
    step = binding.stats()["callables"]["step"]
    assert step["rejected"] == "stale_host_value"  # and never replayed
    with torch.no_grad():
        for i in range(4):
            assert torch.equal(model.step(x_of(i)), ref.step(x_of(i))), i
