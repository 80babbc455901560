"""A batched binding (``bind(batch=W)``): W sessions stacked in one call, their state in
one slot each of a slot-major region, and the ops a contract names in ``rows`` run one
session at a time inside the call (in eager calls, warm-up, capture and so replay).

The model's step mixes sessions on purpose (a mean over the batch axis), so only a
binding that really runs that op per row gives each session its solo bytes; the same
contract without ``rows`` is the control that shows the comparison can fail."""

import importlib

import pytest
import torch

from duplexcadence.compiler.driver import compile_source
from fuzzing import import_package

CONTRACT = """
contract rows_demo
clock frame = 1 per call
region acc {{
  dtype float32
  dims [1, 4]
  lifetime session
  site acc
  slot 0
}}
callable step {{
  site step
  per frame
  arg x: float32 [1, 4]
  writes acc
  batch widths {{2, 4}}{rows}
}}
"""
ROWS = " rows {aten.mean.dim}"


class RowsModel(torch.nn.Module):
    """``width`` sessions of a one-layer step with a per-session accumulator."""

    def __init__(self, width: int) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.w = torch.nn.Parameter(torch.randn(4, 4), requires_grad=False)
        self.acc = torch.zeros(width, 4)

    def step(self, x: torch.Tensor) -> torch.Tensor:
        # at batch 1 the mean over axis 0 is the session's own row; batched, it mixes
        # every session's rows unless it runs per row
        y = (x * x.mean(dim=0, keepdim=True)) @ self.w
        self.acc.add_(y)
        return y + self.acc


def adapter(rows: str):
    result = compile_source(CONTRACT.format(rows=rows), "rows_demo.clock")
    assert result.ok, result.diagnostics
    name, _ = import_package(result.files)
    return importlib.import_module(f"{name}.adapter")


def streams(width: int, frames: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return [torch.randn(width, 4, generator=g) for _ in range(frames)]


def solo(
    session: int, xs: list[torch.Tensor], device: str = "cpu"
) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Session ``session``'s outputs and final state on a stock batch-1 model."""
    model = RowsModel(1).to(device)
    model.acc = model.acc.to(device)
    outs = [model.step(x[session : session + 1].to(device)).clone() for x in xs]
    return outs, model.acc.clone()


def run_batched(rows: str, width: int, xs: list[torch.Tensor], device: str = "cpu"):
    """A width-``width`` stock model bound at ``batch=width``: simulated graphs on the
    CPU, CUDA graphs on ``cuda``."""
    model = RowsModel(width).to(device)
    model.acc = model.acc.to(device)
    backend = "simulate" if device == "cpu" else None
    binding = adapter(rows).bind(model, device=device, backend=backend, batch=width, progress=False)
    outs = [model.step(x.to(device)).clone() for x in xs]
    return binding, outs


def test_each_session_of_a_batched_binding_gets_its_solo_bytes():
    width, xs = 4, streams(4, 5)
    binding, outs = run_batched(ROWS, width, xs)
    for s in range(width):
        ref, acc = solo(s, xs)
        for f, (got, want) in enumerate(zip(outs, ref)):
            assert torch.equal(got[s : s + 1], want), (s, f)
        # session s's state is slot s of one region, at the address bind installed
        assert torch.equal(binding.regions["acc"].tensor[s : s + 1], acc)
    assert binding.regions["acc"].tensor.shape == (width, 4)
    step = binding.stats()["callables"]["step"]
    assert step["hits"] == len(xs) and step["misses"] == {}, step  # every call replayed
    assert binding.stats()["batch"] == {
        "width": 4,
        "widths": [2, 4],
        "rows": {"step": ["aten.mean.dim"]},
        "row_streams": 0,  # side streams are a CUDA matter
        "proof": None,  # none given: the rows are the contract's word
    }
    assert (
        "lockstep: 4 sessions per call (declared widths 2, 4); ops per row: step: aten.mean.dim"
        in binding.report()
    )


def test_without_rows_the_batched_call_mixes_sessions():
    # the control: the comparison above fails when the op is not run per row
    width, xs = 4, streams(4, 2)
    _, outs = run_batched("", width, xs)
    ref, _ = solo(0, xs)
    assert not torch.equal(outs[0][0:1], ref[0])


def test_a_call_of_another_width_is_a_counted_signature_miss():
    width, xs = 2, streams(2, 1)
    model = RowsModel(width)
    binding = adapter(ROWS).bind(
        model, device="cpu", backend="simulate", batch=width, progress=False
    )
    model.step(xs[0])
    model.step(xs[0][:1].clone())  # one session's rows on a width-2 binding: runs eager
    misses = binding.stats()["callables"]["step"]["misses"]
    assert misses.get("signature", 0) >= 1, misses


@pytest.mark.parametrize(
    "batch, error, match",
    [
        (3, ValueError, r"batch width 3 is not declared \(2, 4\)"),
        (0, ValueError, "at least 1"),
        (True, TypeError, "must be an int"),
        ("2", TypeError, "must be an int"),
    ],
)
def test_bad_batch_widths_are_clear_errors_and_leave_the_model_stock(batch, error, match):
    model = RowsModel(4)
    stock = model.step
    with pytest.raises(error, match=match):
        adapter(ROWS).bind(model, device="cpu", backend="simulate", batch=batch, progress=False)
    assert model.step == stock and type(model.step).__name__ == "method"


def test_a_batched_binding_serves_no_session_pool():
    binding = adapter(ROWS).bind(
        RowsModel(2), device="cpu", backend="simulate", batch=2, progress=False
    )
    with pytest.raises(RuntimeError, match="batched .2 sessions per call"):
        binding.sessions(lanes=1)


def test_width_one_is_the_per_session_declaration():
    model = RowsModel(1)
    binding = adapter(ROWS).bind(model, device="cpu", backend="simulate", batch=1, progress=False)
    xs = streams(1, 3)
    ref, acc = solo(0, xs)
    for x, want in zip(xs, ref):
        assert torch.equal(model.step(x), want)
    assert binding.stats()["batch"] is None and "lockstep" not in binding.report()


@pytest.mark.cuda
def test_batched_cuda_graphs_give_each_session_its_solo_bytes():
    # on CUDA a GEMM of 4 rows may take another kernel than one row's (fp32: measured
    # from width 2 on the H200), so it runs per row too; the elementwise ops stay batched
    width, xs = 4, streams(4, 6)
    binding, outs = run_batched(" rows {aten.mean.dim, aten.mm.default}", width, xs, "cuda")
    step = binding.stats()["callables"]["step"]
    assert step["backend"] == "cuda_graph" and step["hits"] == len(xs), step
    for s in range(width):
        ref, acc = solo(s, xs, "cuda")
        for f, (got, want) in enumerate(zip(outs, ref)):
            assert torch.equal(got[s : s + 1], want), (s, f)
        assert torch.equal(binding.regions["acc"].tensor[s : s + 1], acc)


class MixerModel(RowsModel):
    """The session-mixing mean inside a submodule named ``mixer``; the step's own mean
    (over features, each row alone) is batch-invariant here and stays batched."""

    def __init__(self, width: int) -> None:
        super().__init__(width)
        self.mixer = Mixer()

    def step(self, x: torch.Tensor) -> torch.Tensor:
        y = self.mixer(x) @ self.w
        self.acc.add_(y - y.mean(dim=1, keepdim=True))
        return y + self.acc


class Mixer(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * x.mean(dim=0, keepdim=True)


@pytest.mark.parametrize("scope, exact", [("mixer", True), ("elsewhere", False)])
def test_a_row_op_scoped_to_a_module_runs_per_row_there(scope, exact):
    # `rows {aten.mean.dim in mixer}`: the mean inside `mixer` runs per session, so every
    # session gets its solo bytes; scoped to a module that never runs (the control), the
    # mixing mean stays batched and the sessions' bytes differ
    width, xs = 4, streams(4, 3)
    model = MixerModel(width)
    rows = f" rows {{aten.mean.dim in {scope}}}"
    binding = adapter(rows).bind(model, backend="simulate", batch=width, progress=False)
    outs = [model.step(x).clone() for x in xs]
    same = True
    for s in range(width):
        alone = MixerModel(1)  # session s on a stock batch-1 model, every frame
        same &= all(torch.equal(o[s : s + 1], alone.step(x[s : s + 1])) for o, x in zip(outs, xs))
    assert same is exact
    assert binding.stats()["batch"]["rows"] == {"step": [f"aten.mean.dim in {scope}"]}


def prove(rows: str, width: int = 4, frames: int = 2):
    """``prove_lockstep`` of the rows_demo contract on one RowsModel streaming at batch 1
    and then at ``width`` (row 0 the batch-1 stream's input, the other rows others')."""
    from duplexcadence.runtime.tools.lockstep_proof import prove_lockstep

    contract = importlib.import_module(adapter(rows).__name__.replace("adapter", "contract"))
    model, xs = RowsModel(1), streams(width, frames)

    def run_at(w: int) -> None:
        model.acc = torch.zeros(w, 4)
        for x in xs:
            model.step(x[:w])

    return model, prove_lockstep(
        model, contract.DECLARED, width, lambda: run_at(1), lambda: run_at(width), inputs="seeded"
    )


def test_a_proof_of_the_contracts_rows_is_admitted_and_reported():
    model, proof = prove(ROWS)
    assert proof.proven and proof.callables["step"].ops > 0
    assert proof.callables["step"].rows == ("aten.mean.dim",)
    width, xs = 4, streams(4, 3)
    batched = RowsModel(width)
    binding = adapter(ROWS).bind(
        batched, backend="simulate", batch=width, proof=proof, progress=False
    )
    outs = [batched.step(x).clone() for x in xs]
    for s in range(width):
        assert all(torch.equal(o[s : s + 1], w) for o, w in zip(outs, solo(s, xs)[0]))
    assert binding.stats()["batch"]["proof"]["proven"] is True
    assert "lockstep proof: width 4 proven on cpu, seeded: step:" in binding.report()


def test_a_proof_that_does_not_prove_or_does_not_fit_is_refused_before_install():
    from duplexcadence.runtime.serving.lockstep_proof import LockstepNotProven

    # without rows the batch mean mixes sessions: the proof names the op and its module
    _, unproven = prove("")
    step = unproven.callables["step"]
    assert not unproven.proven and "aten.mean.dim in <top>" in step.broken
    model = RowsModel(4)
    with pytest.raises(LockstepNotProven, match=r"'step' is not proven: row 0 differed .*mean"):
        adapter("").bind(model, backend="simulate", batch=4, proof=unproven, progress=False)
    assert "step" not in vars(model)  # refused before anything was installed
    _, proven = prove(ROWS)
    with pytest.raises(LockstepNotProven, match="proven with rows"):  # other rows
        adapter("").bind(RowsModel(4), backend="simulate", batch=4, proof=proven)
    with pytest.raises(LockstepNotProven, match="of width 4"):  # another width
        adapter(ROWS).bind(RowsModel(2), backend="simulate", batch=2, proof=proven)
    with pytest.raises(TypeError, match="LockstepProof"):
        adapter(ROWS).bind(RowsModel(4), backend="simulate", batch=4, proof={"proven": True})
