"""Sites keyed by a module's identity (`states[id(path)]`) and regions that start as
zeros where their site is absent (`initial zeros`): the language features VoxCPM2's
streaming VAE needs (its per-layer conv states live in a dict keyed by id(module), and
exist only after the stream's first call). Parse, print, validate, lower and bind."""

from __future__ import annotations

import types

import pytest
import torch
from fuzzing import import_package

from duplexcadence.compiler.driver import check_source, compile_source
from duplexcadence.dsl import parser, printer
from duplexcadence.runtime import FakeGraphBackend, SiteError
from duplexcadence.runtime.state.sites import get_at, parse_path, require_sites, set_at

CONTRACT = """
contract idsites
clock chunk = 1 per call
region pad {
  dtype float32
  dims [1, 2, 3]
  address pinned
  site stream.states[id(net.layers[1])]
  initial zeros
}
callable step {
  site net.forward
  per chunk
  arg x: float32 [1, 2, 4]
  writes pad
}
"""


def _codes(text: str) -> list[str]:
    return [d.code for d in check_source(text, "x.clock").diagnostics]


def test_identity_step_and_initial_round_trip_through_the_printer() -> None:
    contract, diags = parser.parse(CONTRACT)
    assert diags == []
    site = contract.regions[0].site
    assert site.steps[-1].kind == "identity"
    assert site.dotted() == "stream.states[id(net.layers[1])]"
    assert contract.regions[0].initial == "zeros"
    again, _ = parser.parse(printer.print_contract(contract))
    assert again.model_dump() == contract.model_dump()
    assert _codes(CONTRACT) == []


@pytest.mark.parametrize(
    "old, new",
    [
        ("id(net.layers[1])", 'id(net.layers["a"])'),  # a key step inside
        ("id(net.layers[1])", "id(net.x[id(net.y)])"),  # a nested identity
        ("site net.forward", "site net.calls[id(net.layers)]"),  # not a region's site
    ],
)
def test_identity_keys_outside_their_form_are_clk055(old: str, new: str) -> None:
    assert "CLK055" in _codes(CONTRACT.replace(old, new))


@pytest.mark.parametrize(
    "old, new",
    [
        ("  address pinned\n", ""),  # only a pinned region starts as zeros
        ("stream.states[id(net.layers[1])]", "stream.pad"),  # the last step is no dict key
    ],
)
def test_initial_zeros_needs_a_pinned_dict_entry_clk056(old: str, new: str) -> None:
    assert "CLK056" in _codes(CONTRACT.replace(old, new))


def test_forbidden_segments_inside_an_identity_key_are_clk050() -> None:
    assert "CLK050" in _codes(CONTRACT.replace("net.layers[1]", "net.__class__"))


def test_lowered_site_is_a_nested_step_tuple() -> None:
    """Generated code spells the site dotted; the runtime reads it back as nested steps."""
    files = compile_source(CONTRACT, "x.clock").files
    assert '"stream.states[id(net.layers[1])]"' in files["contract.py"]
    assert '"initial": "zeros"' in files["contract.py"]
    assert parse_path("stream.states[id(net.layers[1])]")[-1] == (
        "identity",
        (("attr", "net"), ("attr", "layers"), ("index", 1)),
    )


class Net(torch.nn.Module):
    """A stock layer stack that keeps each layer's left context in a dict keyed by
    id(layer), rebinding it every call and padding with zeros where it is absent (the
    shape of VoxCPM2's StreamingVAEDecoder)."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList([torch.nn.Identity(), torch.nn.Conv1d(2, 2, 4)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        states = self.stream.states
        key = id(self.layers[1])
        prev = states[key] if key in states else torch.zeros(1, 2, 3)
        full = torch.cat([prev, x], dim=-1)
        states[key] = full[:, :, -3:]  # a view of this call's input: a new address
        return self.layers[1](full)


def test_identity_sites_resolve_only_modules_in_dicts() -> None:
    net = Net()
    model = types.SimpleNamespace(net=net, stream=types.SimpleNamespace(states={}))
    site = (
        ("attr", "stream"),
        ("attr", "states"),
        ("identity", (("attr", "net"), ("attr", "layers"), ("index", 1))),
    )
    t = torch.ones(1)
    set_at(model, site, t)
    assert model.stream.states == {id(net.layers[1]): t}
    assert get_at(model, site) is t
    with pytest.raises(SiteError, match="names a module"):
        get_at(model, site[:2] + (("identity", (("attr", "stream"),)),))
    with pytest.raises(SiteError, match="attribute and index steps only"):
        get_at(model, site[:2] + (("identity", (("key", "x"),)),))
    model.stream.states = [t]
    with pytest.raises(SiteError, match="not a dict"):
        get_at(model, site)
    with pytest.raises(SiteError):
        require_sites(model, {"pad": site})


def test_bound_pinned_zeros_region_replays_bit_identical_to_stock() -> None:
    torch.manual_seed(0)
    xs = [torch.randn(1, 2, 4) for _ in range(4)]
    stock_net = Net()
    stock_net.stream = types.SimpleNamespace(states={})
    stock = [stock_net(x) for x in xs]

    name, adapter = import_package(compile_source(CONTRACT, "x.clock").files)
    net = Net()
    net.load_state_dict(stock_net.state_dict())
    net.stream = types.SimpleNamespace(states={})  # the site is absent at bind
    model = types.SimpleNamespace(net=net, stream=net.stream)
    binding = adapter.bind(model, device="cpu", capture=False, backend=FakeGraphBackend())
    binding.capture(progress=False)
    region = binding.regions["pad"].tensor
    assert net.stream.states[id(net.layers[1])] is region and not region.any()
    out = [net(x) for x in xs]
    assert net.stream.states[id(net.layers[1])] is region
    stats = binding.stats()["callables"]["step"]
    assert stats["hits"] == len(xs) and stats["eager_calls"] == 0
    binding.unbind()
    for a, b in zip(out, stock):
        assert torch.equal(a, b)


_SITE = parse_path("stream.states[id(net.layers[1])]")


def _moved_dict(net: Net, region: torch.Tensor) -> None:
    net.stream.states = {id(net.layers[1]): region.clone()}  # a new dict, a new address


def _strided_view(net: Net, region: torch.Tensor) -> None:
    # the same pointer and shape, other strides: only the stride differs
    net.stream.states[id(net.layers[1])] = region.as_strided((1, 2, 3), (6, 1, 2))


def _replaced_module(net: Net, region: torch.Tensor) -> None:
    new = torch.nn.Conv1d(2, 2, 4)
    new.load_state_dict(net.layers[1].state_dict())
    net.layers[1] = new  # the identity path now reaches another module and its entry
    net.stream.states[id(new)] = torch.zeros(1, 2, 3)


@pytest.mark.parametrize("change", [_moved_dict, _strided_view, _replaced_module])
def test_a_pinned_site_changed_between_calls_misses_and_names_the_region(change) -> None:
    """Admission reads the write-through sites through compiled reads (site_reads.py):
    a site moved by rebinding an object on its path, a stride changed at the same
    pointer, or a module replaced on the identity path still misses, invalidates the
    class and names the region; the call runs eager and its output equals stock's."""
    torch.manual_seed(0)
    xs = [torch.randn(1, 2, 4) for _ in range(3)]
    name, adapter = import_package(compile_source(CONTRACT, "x.clock").files)
    net = Net()
    net.stream = types.SimpleNamespace(states={})
    model = types.SimpleNamespace(net=net, stream=net.stream)
    binding = adapter.bind(model, device="cpu", capture=False, backend=FakeGraphBackend())
    binding.capture(progress=False)
    region = binding.regions["pad"].tensor
    net(xs[0])  # replayed
    change(net, region)
    stock = Net()
    stock.load_state_dict(net.state_dict())
    stock.stream = types.SimpleNamespace(states={id(stock.layers[1]): get_at(model, _SITE).clone()})
    got = net(xs[1])
    assert torch.equal(got, stock(xs[1]))
    s = binding.stats()["callables"]["step"]
    assert s["hits"] == 1 and s["misses"] == {"write_through_pointer": 1}
    assert s["invalidations"] == 1 and "pad" in s["classes"][0]["detail"]


def test_update_at_through_call_arguments():
    """Item steps through plain containers (a call's arguments) are taken by indexing:
    the leaf is replaced where it changed, left where it stayed (a tuple then needs no
    assignment), and an absent path changes nothing."""
    from duplexcadence.runtime.state.sites import update_at

    t = torch.zeros(2)
    args = {"cache": {"k": t, "v": (t, 1)}}
    assert update_at(args, (("key", "cache"), ("key", "k")), lambda x: x + 1)
    assert torch.equal(args["cache"]["k"], torch.ones(2)) and args["cache"]["k"] is not t
    assert update_at(args, (("key", "cache"), ("key", "v"), ("index", 0)), lambda x: x)
    with pytest.raises(SiteError, match="tuple cannot be assigned"):
        update_at(args, (("key", "cache"), ("key", "v"), ("index", 0)), lambda x: x + 1)
    assert not update_at(args, (("key", "cache"), ("key", "absent")), lambda x: 1 / 0)
    assert not update_at(args, (("key", "cache"), ("key", "v"), ("index", 5)), lambda x: 1 / 0)
    assert args["cache"]["v"][0] is t
