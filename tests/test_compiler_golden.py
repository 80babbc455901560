"""Golden generated packages, and the generated code driving a real module on CPU.

Rebuild the goldens with `UPDATE_GOLDEN=1 pytest tests/test_compiler_golden.py`.
"""

import os
from pathlib import Path

import pytest
import torch

from duplexcadence.compiler.driver import compile_source
from fuzzing import import_package

GOLDEN = Path(__file__).parent / "golden"
CASES = sorted(p for p in GOLDEN.iterdir() if (p / "contract.clock").exists())


def _compile(case: Path):
    source = (case / "contract.clock").read_text()
    result = compile_source(source, f"golden/{case.name}/contract.clock")
    assert result.ok, result.diagnostics
    return result


@pytest.mark.parametrize("case", CASES, ids=lambda p: p.name)
def test_generated_package_matches_golden(case: Path):
    result = _compile(case)
    expected_dir = case / "expected"
    if os.environ.get("UPDATE_GOLDEN"):
        expected_dir.mkdir(exist_ok=True)
        for name, text in result.files.items():
            (expected_dir / name).write_text(text)
    assert sorted(p.name for p in expected_dir.iterdir()) == sorted(result.files)
    for name, text in result.files.items():
        assert text == (expected_dir / name).read_text(), f"{case.name}/{name} drifted"


class _Model:
    """A tiny streaming module with the stock habits the contract describes."""

    def __init__(self):
        self.scratch = torch.zeros(2, 64, 16)
        self.table = torch.arange(16, dtype=torch.float32)
        self.state = {"kv": torch.randn(2, 6, 16)}

    def step(self, x, cache=None, final=False):
        n = cache.shape[1]
        new = x.reshape(1, -1, 16).expand(2, -1, 16) * (1.5 if final else 1.0) + self.table
        self.scratch[:, : n + new.shape[1]] = torch.cat([cache, new], dim=1)
        history = self.scratch[:, : n + new.shape[1]]
        return history.sum(dim=1), history

    def noisy(self, x):
        return x + torch.rand_like(x)


def _stock_stream(model, xs):
    outs = []
    for x, final in xs:
        out, history = model.step(x, cache=model.state["kv"], final=final)
        if history.shape[1] > 14:  # the stock trim: cat(head 6, tail 8)
            history = torch.cat([history[:, :6], history[:, -8:]], dim=1)
        model.state["kv"] = history.clone()
        outs.append(out.clone())
    return outs


def test_generated_bind_is_exact_on_cpu():
    result = _compile(GOLDEN / "streaming_cache")
    _, adapter = import_package(result.files)
    torch.manual_seed(0)
    xs = [(torch.randn(1, 4, 16), False) for _ in range(6)] + [(torch.randn(1, 6, 16), True)]
    torch.manual_seed(1)
    stock = _stock_stream(_Model(), xs)
    torch.manual_seed(1)
    model = _Model()
    binding = adapter.bind(model, device="cpu", audit=True)
    kv = binding.regions["kv"]
    # planned bytes are exactly the bytes the generated code allocated
    analysis = {r.name: r for r in result.analysis.regions}
    for name, region in binding.regions.items():
        assert region.tensor.numel() * region.tensor.element_size() == analysis[name].demand_bytes
    assert tuple(model.scratch.shape) == (2, 20, 16)  # extent(kv) + f_call, not 64
    got = []
    for x, final in xs:
        out, history = model.step(x, cache=model.state["kv"], final=final)
        got.append(out.clone())
        model.state["kv"] = history  # the stock trim finds nothing to cut: writeback did it
        assert history.data_ptr() == kv.data_ptr()
    for a, b in zip(got, stock):
        assert torch.equal(a, b)
    # every retention was audited, the bind-time adoption of the primed state included
    assert kv.audit_divergences == 0 and kv.audit_checks == len(xs) + kv.adoptions == len(xs) + 1
    assert binding.stats()["callables"]["step"]["misses"]  # CPU: eager, counted by reason


def test_bind_to_the_wrong_object_fails_clearly_and_changes_nothing():
    from duplexcadence.runtime import SiteError

    result = _compile(GOLDEN / "streaming_cache")
    _, adapter = import_package(result.files)
    model = _Model()
    del model.scratch  # a model of another version: one declared site is missing
    before = dict(vars(model))
    with pytest.raises(SiteError, match=r"scratch at scratch.*nothing was changed"):
        adapter.bind(model, device="cpu")
    assert vars(model) == before
