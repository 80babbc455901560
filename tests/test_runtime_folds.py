"""Folded weight norm (runtime/state/folds.py) on a tiny conv net with both weight-norm styles.

The net mixes old-style ``torch.nn.utils.weight_norm`` (a forward pre-hook, ``weight_g``
and ``weight_v``) and new-style ``parametrizations.weight_norm`` (``original0``/``1``).
Bound with a fold, every call through the fake graph backend's replay equals an
unbound stock net's output bit for bit, the folded modules hold one ``weight``
Parameter and no hook or parametrization, and ``unbind()`` puts back the stock modules
(same hooks, parametrizations, parameter objects, names, order and values). A site
without weight norm is refused before anything changes.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch.nn.utils import parametrize
from torch.nn.utils.parametrizations import weight_norm as new_style
from torch.nn.utils.weight_norm import WeightNorm

from duplexcadence.runtime import (
    CallableDecl,
    CaptureClass,
    ContractDecl,
    Dispatcher,
    FoldDecl,
    FoldError,
    TensorSpec,
    bind_contract,
)

X_SHAPE = (1, 3, 40)


def old_style(module: torch.nn.Module, **kw) -> torch.nn.Module:
    with warnings.catch_warnings():  # deprecated in torch, still what vendors ship
        warnings.simplefilter("ignore", FutureWarning)
        return torch.nn.utils.weight_norm(module, **kw)


def build_net(device="cpu") -> torch.nn.Sequential:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        old_style(torch.nn.Conv1d(3, 8, 5)),
        torch.nn.LeakyReLU(0.1),
        new_style(torch.nn.ConvTranspose1d(8, 6, 4, stride=2)),
        torch.nn.Sequential(old_style(torch.nn.Conv1d(6, 4, 3), dim=None), torch.nn.Tanh()),
        new_style(torch.nn.Conv1d(4, 2, 3), dim=1),
        torch.nn.Conv1d(2, 1, 1),  # no weight norm: left alone
    ).to(device)


class Vocoder:
    """The vendor object: its net, and the decode the contract replays."""

    def __init__(self, device="cpu") -> None:
        self.net = build_net(device)

    def decode(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def decl(site="net") -> ContractDecl:
    return ContractDecl(
        name="toy_fold",
        target=None,
        source_sha256="",
        determinism={},
        regions={},
        callables=(
            CallableDecl(
                "decode",
                site=(("attr", "decode"),),
                classes=(CaptureClass("x", (TensorSpec(X_SHAPE, torch.float32),)),),
            ),
        ),
        folds=(FoldDecl("net_weight_norm", "weight_norm", site=site),),
    )


def inputs(n: int, device="cpu") -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    return [torch.randn(X_SHAPE, generator=g).to(device) for _ in range(n)]


def normed(net: torch.nn.Module) -> list[torch.nn.Module]:
    return [net[0], net[2], net[3][0], net[4]]


def original_bytes(net: torch.nn.Module) -> int:
    """The bytes of every g and v, in both styles."""
    ends = ("weight_g", "weight_v", "original0", "original1")
    return sum(p.nbytes for n, p in net.named_parameters() if n.endswith(ends))


def snapshot(net: torch.nn.Module) -> dict:
    """Everything unbind() must put back: names and order, values, parameter objects,
    hooks, parametrized classes."""
    return {
        "state": {k: v.clone() for k, v in net.state_dict().items()},
        "params": [(n, id(p)) for n, p in net.named_parameters()],
        "hooks": [list(m._forward_pre_hooks.items()) for m in net.modules()],
        "classes": [type(m) for m in net.modules()],
    }


def assert_same(a: dict, b: dict) -> None:
    assert list(a["state"]) == list(b["state"])
    assert all(torch.equal(a["state"][k], b["state"][k]) for k in a["state"])
    assert a["params"] == b["params"]
    assert a["hooks"] == b["hooks"]
    assert a["classes"] == b["classes"]


def test_a_folded_binding_replays_bit_identical_to_the_unfolded_stock() -> None:
    stock = Vocoder()
    xs = inputs(5)
    with torch.no_grad():
        expected = [stock.decode(x) for x in xs]
    model = Vocoder()
    binding = bind_contract(model, decl(), backend="simulate", progress=False)
    with torch.no_grad():
        got = [model.decode(x) for x in xs]
    assert all(torch.equal(a, b) for a, b in zip(got, expected))
    calls = binding.stats()["callables"]["decode"]
    assert calls["hits"] == 5 and calls["misses"] == {}  # every call through the replay path
    originals = original_bytes(stock.net)
    assert binding.stats()["folds"] == {
        "net_weight_norm": {"modules": 4, "device_bytes_freed": 0, "host_bytes_kept": originals}
    }
    assert "fold net_weight_norm: weight norm folded in 4 modules under net" in binding.report()


def test_folded_modules_hold_their_weight_as_one_parameter_and_no_originals() -> None:
    model = Vocoder()
    stock_weights = [m.weight.detach().clone() for m in normed(model.net)]
    bind_contract(model, decl(), backend="simulate", capture=False, progress=False)
    for m, w in zip(normed(model.net), stock_weights):
        assert isinstance(m._parameters["weight"], torch.nn.Parameter)
        assert sorted(n for n, _ in m.named_parameters()) == ["bias", "weight"]
        assert not any(isinstance(h, WeightNorm) for h in m._forward_pre_hooks.values())
        assert not parametrize.is_parametrized(m)
        assert type(m) in (torch.nn.Conv1d, torch.nn.ConvTranspose1d)
        assert torch.equal(m.weight, w)  # the weight the stock forward computes
    assert sorted(model.net.state_dict()) == sorted(
        f"{i}.{n}" for i in ("0", "2", "3.0", "4", "5") for n in ("weight", "bias")
    )


def test_unbind_restores_the_stock_modules_exactly() -> None:
    model = Vocoder()
    before = snapshot(model.net)
    binding = bind_contract(model, decl(), backend="simulate", progress=False)
    x = inputs(1)[0]
    with torch.no_grad():
        folded = model.decode(x)
    binding.unbind()
    assert_same(snapshot(model.net), before)
    assert not isinstance(model.decode, Dispatcher)
    with torch.no_grad():  # the hooks and parametrizations compute the weight again
        assert torch.equal(model.decode(x), folded)
        assert torch.equal(model.decode(x), Vocoder().decode(x))


def test_a_bind_that_fails_after_folding_puts_the_stock_modules_back(monkeypatch) -> None:
    from duplexcadence.runtime.serving import binder

    def no_lane(*args, **kwargs):
        raise RuntimeError("out of memory building lane 0")

    model = Vocoder()
    before = snapshot(model.net)
    monkeypatch.setattr(binder, "Lane", no_lane)
    with pytest.raises(RuntimeError, match="out of memory building lane 0"):
        bind_contract(model, decl(), backend="simulate", progress=False)
    assert_same(snapshot(model.net), before)
    assert "decode" not in vars(model)


@pytest.mark.parametrize("site", ["net[5]", "net[1]"])
def test_a_site_without_weight_norm_is_refused_before_any_change(site) -> None:
    model = Vocoder()
    before = snapshot(model.net)
    with pytest.raises(FoldError, match="no module under the site is weight-normed"):
        bind_contract(model, decl(site), backend="simulate", progress=False)
    assert_same(snapshot(model.net), before)
    assert "decode" not in vars(model)  # the callable was not replaced either


def test_a_site_that_is_not_a_module_is_refused() -> None:
    model = Vocoder()
    model.table = {"a": 1}
    with pytest.raises(FoldError, match="not a torch module"):
        bind_contract(model, decl("table"), backend="simulate", progress=False)


def test_a_weight_norm_beside_another_parametrization_is_refused() -> None:
    class Scale(torch.nn.Module):
        def forward(self, b: torch.Tensor) -> torch.Tensor:
            return 2 * b

    model = Vocoder()
    parametrize.register_parametrization(model.net[2], "bias", Scale())
    with pytest.raises(FoldError, match=r"other parametrizations \(bias\)"):
        bind_contract(model, decl(), backend="simulate", progress=False)
    assert parametrize.is_parametrized(model.net[2], "weight")


@pytest.mark.cuda
def test_on_cuda_the_originals_leave_the_device_and_captured_graphs_stay_exact() -> None:
    """Real CUDA graphs over the folded net equal the unfolded stock, the originals'
    bytes leave the device, and unbind() brings them back to it."""
    device = torch.device("cuda")
    flags = torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False  # DESIGN 6b
    try:
        stock = Vocoder(device)
        xs = inputs(4, device)
        with torch.no_grad():
            expected = [stock.decode(x) for x in xs]
        model = Vocoder(device)
        with torch.no_grad():  # as a served model has: the old-style hook's cached weight is
            model.decode(xs[0])  # computed on the device by a forward (.to() leaves it behind)
        originals = original_bytes(model.net)
        # the old hook keeps a weight beside g and v, the new parametrization does not
        new_style_weights = model.net[2].weight.nbytes + model.net[4].weight.nbytes
        binding = bind_contract(model, decl(), device=device, progress=False)
        freed = binding.stats()["folds"]["net_weight_norm"]["device_bytes_freed"]
        assert freed == originals - new_style_weights > 0
        kept = [p for site in binding.folds for m in site.modules for p, _ in m.originals]
        assert len(kept) == 8 and all(p.device.type == "cpu" for p in kept)
        with torch.no_grad():
            got = [model.decode(x) for x in xs]
        assert all(torch.equal(a, b) for a, b in zip(got, expected))
        assert binding.stats()["callables"]["decode"]["hits"] == 4
        assert all(p.device.type == "cuda" for p in model.net.parameters())
        binding.unbind()
        assert all(p.device.type == "cuda" for p in model.net.parameters())
        with torch.no_grad():
            assert torch.equal(model.decode(xs[0]), expected[0])
    finally:
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = flags
