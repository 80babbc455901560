"""runtime/tools/batch_rows.py on small synthetic modules (the engine, not a result):
a row-wise module is proven at every width, an op that mixes rows is named alone (the
ops after it, fed repaired rows, are not blamed), a branch on the batch size is a
divergence, and a fingerprint-only output is still compared."""

from __future__ import annotations

import threading

import pytest
import torch

from duplexcadence.runtime.tools.batch_rows import PerRow, batch_axis, prove_rows, weight_storages


class RowWise(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scale = torch.nn.Parameter(torch.linspace(0.5, 1.5, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(x * self.scale + 1.0)
        return y / y.sum(-1, keepdim=True)


class MixesRows(RowWise):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        centred = x - x.mean(0, keepdim=True)  # row 0 depends on the other rows
        return torch.tanh(centred * self.scale)


class BranchesOnBatch(RowWise):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] > 1:
            x = x.clone()
        return x * self.scale


class Accumulates(RowWise):
    """A stream state written in place, one row per session."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.register_buffer("state", torch.zeros(width, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.state.add_(x * self.scale)
        return self.state.clone()


def _rows(width: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    one = torch.randn(1, 8, generator=g)
    many = torch.cat([one, torch.randn(width - 1, 8, generator=g) * 10])
    return one, many


@pytest.mark.parametrize("width", [2, 3, 8])
def test_a_row_wise_module_is_proven(width):
    m = RowWise()
    one, many = _rows(width)
    proof = prove_rows(m, lambda: m(one), lambda: m(many), width)
    assert proof.proven, proof.summary()
    assert proof.ops >= 5


def test_the_op_that_mixes_rows_is_named_and_nothing_after_it():
    m = MixesRows()
    one, many = _rows(4)
    proof = prove_rows(m, lambda: m(one), lambda: m(many), 4)
    assert not proof.proven
    assert [v.op for v in proof.broken] == ["aten.mean.dim"], proof.summary()
    (v,) = proof.broken
    assert v.axis == -1 and v.repaired  # same shape as batch 1: compared and repaired whole
    assert proof.by_op() == {"aten.mean.dim in <top>": 1}


def test_the_named_op_run_per_row_gives_each_row_its_batch_1_bits():
    m = MixesRows()
    one, many = _rows(4)
    proof = prove_rows(m, lambda: m(one), lambda: m(many), 4, per_row={"aten.mean.dim"})
    assert proof.proven, proof.summary()
    per_row = PerRow({"aten.mean.dim"}, 4)
    with per_row:
        got = m(many)
    assert per_row.calls == 1
    for r in range(4):  # every row is its own solo run, not only row 0
        assert torch.equal(got[r : r + 1], m(many[r : r + 1]))


def test_per_row_splits_folded_rows_and_never_a_weight():
    lin = torch.nn.Linear(8, 8, bias=False)  # its weight's 8 rows split into 2 as well
    x = torch.randn(2 * 3, 8, generator=torch.Generator().manual_seed(1))  # (B * T, D)
    per_row = PerRow({"aten.mm.default"}, 2, weight_storages(lin))
    with per_row:
        got = lin(x)
    assert per_row.calls == 1
    assert torch.equal(got, torch.cat([lin(x[:3]), lin(x[3:])]))


class MmShapes(torch.utils._python_dispatch.TorchDispatchMode):
    """The first argument's shape of each ``aten.mm.default`` call that reaches it."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if str(func) == "aten.mm.default":
            self.seen.append(tuple(args[0].shape))
        return func(*args, **(kwargs or {}))


def test_per_row_blocks_run_the_op_on_that_many_sessions_at_once():
    # `rows {aten.mm.default by 2}` at width 4: two calls of two sessions each (the
    # batch-2 call's bits, where the proof found the kernel invariant up to 2)
    lin = torch.nn.Linear(8, 8, bias=False)
    x = torch.randn(4 * 3, 8, generator=torch.Generator().manual_seed(2))
    shapes = MmShapes()

    per_row = PerRow({"aten.mm.default": 2}, 4, weight_storages(lin))
    with shapes, per_row:  # the mode entered last sees the call first
        got = lin(x)
    assert shapes.seen == [(6, 8), (6, 8)]
    assert torch.equal(got, torch.cat([lin(x[:6]), lin(x[6:])]))
    with pytest.raises(ValueError, match="divide the width 4"):
        PerRow({"aten.mm.default": 3}, 4)


def test_per_row_sees_the_kernels_of_composite_ops_under_inference_mode():
    # a binding calls its callables under inference mode, where a mode sees aten.linear
    # whole; PerRow decomposes it (the code that runs anyway) and finds the aten.mm a
    # proof names, so the declared per-row op is not silently skipped
    lin = torch.nn.Linear(8, 8, bias=False)
    x = torch.randn(2, 1, 8, generator=torch.Generator().manual_seed(4))
    per_row = PerRow({"aten.mm.default"}, 2, weight_storages(lin))
    with torch.inference_mode(), per_row:
        got = lin(x)
    assert per_row.calls == 1
    with torch.inference_mode():
        assert torch.equal(got, torch.cat([lin(x[:1]), lin(x[1:])]))


def test_per_row_finds_sessions_folded_on_a_later_axis():
    # torch.cdist passes its rows as [1, N, D] against a codebook [1, K, D]: the sessions
    # are on axis 1, and the codebook (K rows, not N) is never split
    g = torch.Generator().manual_seed(3)
    x, codebook = torch.randn(4, 8, generator=g), torch.randn(32, 8, generator=g)
    per_row = PerRow({"aten._euclidean_dist.default", "aten._cdist_forward.default"}, 4)
    with per_row:
        got = torch.cdist(x[None], codebook[None])[0]
    assert per_row.calls == 1
    for r in range(4):
        assert torch.equal(got[r : r + 1], torch.cdist(x[None, r : r + 1], codebook[None])[0])


def test_a_branch_on_the_batch_size_is_a_divergence():
    m = BranchesOnBatch()
    one, many = _rows(2)
    proof = prove_rows(m, lambda: m(one), lambda: m(many), 2)
    assert proof.diverged_at is not None and "clone" in proof.diverged
    assert not proof.proven


def test_in_place_state_and_fingerprint_only_outputs():
    one, many = _rows(4)
    m1, m4 = Accumulates(1), Accumulates(4)
    m4.state[1:] = 7.0  # other sessions' state: anything
    steps = 3
    # keep_bytes=0: every output compared by its fingerprint only
    for keep in (1 << 20, 0):
        m1.state.zero_()
        m4.state[0].zero_()
        proof = prove_rows(
            torch.nn.ModuleList([m1, m4]),
            lambda: [m1(one) for _ in range(steps)],
            lambda: [m4(many) for _ in range(steps)],
            4,
            keep_bytes=keep,
        )
        assert proof.proven, (keep, proof.summary())
    m4.state[0].fill_(1.0)  # a row-0 state that is not the batch-1 one
    proof = prove_rows(
        torch.nn.ModuleList([m1, m4]), lambda: m1(one), lambda: m4(many), 4, keep_bytes=0
    )
    assert not proof.proven and not proof.broken[0].repaired


def test_batch_axis_and_width():
    assert batch_axis((1, 8), (4, 8), 4) == 0
    assert batch_axis((3, 1, 8), (3, 4, 8), 4) == 1
    assert batch_axis((2, 8), (2, 8), 4) == -1
    assert batch_axis((2, 8), (3, 8), 4) is None
    assert batch_axis((2, 8), (8,), 4) is None
    with pytest.raises(ValueError, match="at least 2"):
        prove_rows(RowWise(), lambda: None, lambda: None, 1)


def test_per_row_side_streams_leave_cpu_calls_inline():
    # streams are a CUDA matter: a CPU call with streams given runs its blocks inline
    lin = torch.nn.Linear(8, 8, bias=False)
    x = torch.randn(4, 1, 8, generator=torch.Generator().manual_seed(5))
    per_row = PerRow({"aten.mm.default"}, 4, weight_storages(lin), streams=["unused"])
    with per_row:
        got = lin(x)
    assert per_row.calls == 1
    assert torch.equal(got, torch.cat([lin(x[r : r + 1]) for r in range(4)]))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_per_row_blocks_on_side_streams_give_the_inline_bits_eager_and_in_a_graph():
    # the blocks of one op on 3 side streams (width 8: streams reused round-robin) are
    # the same calls as inline, so the same bits; captured, they are parallel branches
    # that the capturing stream joins before the results are read
    g = torch.Generator(device="cuda").manual_seed(6)
    lin = torch.nn.Linear(512, 512, device="cuda")
    x = torch.randn(8, 3, 512, device="cuda", generator=g)
    ops = {"aten.addmm.default", "aten.mm.default", "aten.mean.dim"}
    streams = [torch.cuda.Stream() for _ in range(3)]

    def f(v: torch.Tensor) -> torch.Tensor:
        return lin(v).square().mean(dim=2, keepdim=True) * v

    with torch.inference_mode():
        with PerRow(ops, 8, weight_storages(lin)):
            inline = f(x)
        with PerRow(ops, 8, weight_storages(lin), streams) as per_row:
            branched = f(x)
        assert per_row.calls == 2 and torch.equal(branched, inline)
        static = x.clone()
        graph = torch.cuda.CUDAGraph()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            with PerRow(ops, 8, weight_storages(lin), streams):
                f(static)  # warm-up on the capture stream's side, as a binding does
        torch.cuda.current_stream().wait_stream(side)
        with torch.cuda.graph(graph):
            with PerRow(ops, 8, weight_storages(lin), streams):
                out = f(static)
        static.copy_(torch.randn(8, 3, 512, device="cuda", generator=g))
        graph.replay()
        with PerRow(ops, 8, weight_storages(lin)):
            expected = f(static)
        torch.cuda.synchronize()
        assert torch.equal(out, expected)


class TwoLinears(torch.nn.Module):
    """Two projections, one inside a submodule named ``gating``: the proof named only
    the one in ``gating`` (as in Moshi's LM at widths 16 and 32)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(7)
        self.proj = torch.nn.Linear(8, 8, bias=False)
        self.gating = torch.nn.Sequential(torch.nn.Linear(8, 8, bias=False))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.gating(self.proj(x))


def test_a_per_row_op_scoped_to_a_module_runs_per_row_only_inside_it():
    from duplexcadence.runtime.engine.module_scope import module_paths

    m = TwoLinears()
    x = torch.randn(4, 1, 8, generator=torch.Generator().manual_seed(8))
    shapes = MmShapes()

    per_row = PerRow(
        {"aten.mm.default in gating": 2}, 4, weight_storages(m), modules=module_paths(m)
    )
    with torch.inference_mode(), shapes, per_row:
        got = m(x)
    # the projection outside `gating` ran whole (4 rows), the one inside on blocks of 2
    assert shapes.seen == [(4, 8), (2, 8), (2, 8)] and per_row.calls == 1
    with torch.inference_mode():
        h = m.proj(x)
        assert torch.equal(got, torch.cat([m.gating(h[:2]), m.gating(h[2:])]))
    assert per_row.ops == {"aten.mm.default in gating"}
    with pytest.raises(ValueError, match="module paths"):
        PerRow({"aten.mm.default in gating"}, 4)


def test_a_module_scope_matches_whole_path_components_on_its_own_thread_only():
    from duplexcadence.runtime.engine.module_scope import ModuleScope, module_paths

    m = TwoLinears()
    paths = module_paths(m)
    assert sorted(paths.values()) == ["", "gating", "gating.0", "proj"]
    found: dict = {}
    scope = ModuleScope(paths)

    class Probe(torch.nn.Module):
        def forward(self, x):
            found[threading.current_thread().name] = scope.inside("gating")
            return x

    m.gating.append(Probe())
    paths = module_paths(m)
    scope.names = paths
    with scope:
        m(torch.randn(1, 8))
        other = threading.Thread(target=lambda: m(torch.randn(1, 8)), name="other")
        other.start()
        other.join()
        assert not scope.inside("gating")  # left the module
    assert found == {"MainThread": True, "other": False}
    cases = [
        ("gating", "layers.0.subgating", False),  # a component boundary
        ("gating", "layers.0.gating.linear_in", True),
        ("transformer.layers.*.gating", "lm.transformer.layers.12.gating", True),
        ("transformer.layers.*.gating", "lm.depformer.layers.12.gating", False),
        ("transformer.layers.*.gating", "lm.transformer.layers.gating", False),
    ]
    for pattern, path, inside in cases:
        scope._stack = [path]
        assert scope.inside(pattern) is inside, (pattern, path)
