"""A tiny workload for the harness tests: a seeded two-layer torch module streamed one
step at a time, with a part (``layer``) and two streams. ``python -m
tests.fake_workload`` runs it through bench.harness exactly as bench.token2wav runs
the real one, in seconds on a CPU.

Cells: ``stock`` (the reference), ``same`` (the same computation by another path:
exact), ``noisy`` (adds 1e-6 to every output: not exact), ``boom`` (its set-up
raises), ``gpu`` (needs CUDA).
"""

from __future__ import annotations

import torch

from bench.harness import Cell, Stream, WorkerContext, Workload, main


class Tiny(torch.nn.Module):
    def __init__(self, seed: int) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.layer = torch.nn.Linear(16, 16)
        self.head = torch.nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.layer(x)))


class FakeRun:
    def __init__(self, ctx: WorkerContext) -> None:
        self.ctx, self.model = ctx, None
        g = torch.Generator().manual_seed(1000 + ctx.args.seed)
        self.inputs = iter(torch.randn(ctx.n_steps, 1, 16, generator=g))

    def build(self) -> None:
        self.model = Tiny(self.ctx.args.seed).to(self.ctx.device)

    def setup(self) -> None:
        if self.ctx.cell.name == "boom":
            raise RuntimeError("boom set-up")
        self.ctx.setup["cell"] = self.ctx.cell.name

    @torch.no_grad()
    def step(self) -> dict:
        x = next(self.inputs).to(self.ctx.device)
        if self.ctx.cell.name == "same":
            y = self.model.head(torch.tanh(torch.nn.functional.linear(x, *self.weights())))
        else:
            y = self.model(x)
        if self.ctx.cell.name == "noisy":
            y = y + 1e-6
        return {"out": y, "argmax": y.argmax(-1)}

    def weights(self) -> tuple:
        return self.model.layer.weight, self.model.layer.bias

    def after(self, phase: str) -> None:
        self.ctx.result.setdefault("phases_seen", []).append(phase)

    def finish(self, result: dict) -> None:
        result["finished"] = True


WORKLOAD = Workload(
    name="fake",
    unit="step",
    cells=(
        Cell("stock", "reference"),
        Cell("same", "same numbers, another path"),
        Cell("noisy", "adds 1e-6"),
        Cell("boom", "set-up raises", failure="the fake set-up"),
        Cell("gpu", "needs CUDA", needs_cuda=True),
    ),
    reference="stock",
    start=FakeRun,
    streams=(
        Stream("out", "float32", key="out_sha256", step_key="step_out_sha256", count_key="n_out"),
        Stream(
            "argmax",
            "int64",
            key="argmax_sha256",
            step_key="step_argmax_sha256",
            values_key="argmax_values",
        ),
    ),
    title=lambda doc: "fake workload",
    parts={"layer": "layer.forward"},
    final_steps=1,
    defaults={"steps": 3, "warmup": 1, "split_steps": 1, "profile_steps": 0},
    quick={"device": "cpu", "blocks": 1},
    first_worker_est_s={"boom": 5.0},
    module="tests.fake_workload",
)

if __name__ == "__main__":
    raise SystemExit(main(WORKLOAD))
