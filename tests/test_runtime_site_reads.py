"""SiteReads (runtime/state/site_reads.py): many sites read on every call as ``get_at`` reads
them, with the path rules checked once per chain of objects. Every change of an object
a path passes through is read again through ``get_at``: the new value, or its SiteError."""

from __future__ import annotations

import types

import pytest
import torch

from duplexcadence.runtime import SiteError
from duplexcadence.runtime.state.site_reads import SiteReads
from duplexcadence.runtime.state.sites import get_at, parse_path

SITES = {
    "a": parse_path("stream.states[id(net.layers[1])]"),
    "b": parse_path("stream.states[id(net.layers[2].inner[0])]"),
    "w": parse_path("net.layers[1].weight"),
    "c": parse_path('cache["k"][1]'),
}


def _model() -> types.SimpleNamespace:
    inner = torch.nn.Module()
    inner.inner = torch.nn.Sequential(torch.nn.Linear(2, 2))
    net = torch.nn.Module()
    net.layers = torch.nn.ModuleList([torch.nn.Identity(), torch.nn.Linear(2, 2), inner])
    states = {id(net.layers[1]): torch.zeros(3), id(inner.inner[0]): torch.ones(2)}
    return types.SimpleNamespace(
        net=net,
        stream=types.SimpleNamespace(states=states),
        cache={"k": [torch.zeros(1), torch.full((1,), 5.0)]},
    )


def _same(values: list, model: types.SimpleNamespace) -> bool:
    return all(v is get_at(model, steps) for v, steps in zip(values, SITES.values()))


def test_reads_are_get_at_and_check_the_rules_once_per_chain() -> None:
    model = _model()
    reads = SiteReads(model, SITES)
    for _ in range(3):
        assert _same(reads.read(), model)
    assert reads.checks == 1
    # a site's own value rebound (what a pinned region's stock code does): read, no check
    model.stream.states[id(model.net.layers[1])] = torch.full((3,), 2.0)
    model.cache["k"][1] = torch.zeros(4)
    assert _same(reads.read(), model) and reads.checks == 1


@pytest.mark.parametrize(
    "change",
    [
        lambda m: setattr(m.stream, "states", dict(m.stream.states)),  # a new dict
        lambda m: m.net.layers.__setitem__(2, m.net.layers[2]),  # the same module: no change
        lambda m: setattr(m, "cache", {"k": list(m.cache["k"])}),  # a new list on the path
    ],
)
def test_an_object_on_a_path_rebound_is_read_through_get_at(change) -> None:
    model = _model()
    reads = SiteReads(model, SITES)
    reads.read()
    change(model)
    assert _same(reads.read(), model)
    assert _same(reads.read(), model)


def test_a_module_replaced_on_an_identity_path_reads_the_new_modules_entry() -> None:
    """The identity key follows the module now at the path: its entry is read, the
    old module's (still in the dict) is not."""
    model = _model()
    reads = SiteReads(model, SITES)
    old = reads.read()
    new = torch.nn.Linear(2, 2)
    model.net.layers[1] = new
    model.stream.states[id(new)] = torch.full((3,), 9.0)
    values = reads.read()
    assert values[0] is model.stream.states[id(new)] and values[0] is not old[0]
    assert values[2] is new.weight
    assert reads.checks == 2


def test_a_path_that_breaks_the_rules_raises_get_ats_site_error() -> None:
    model = _model()
    reads = SiteReads(model, SITES)
    reads.read()
    model.stream.states = list(model.stream.states.values())  # not a dict any more
    with pytest.raises(SiteError, match="not a dict"):
        reads.read()
    model = _model()
    reads = SiteReads(model, SITES)
    reads.read()
    del model.stream.states[id(model.net.layers[2].inner[0])]  # the entry is gone
    with pytest.raises(SiteError, match="no entry for the module"):
        reads.read()


def test_shared_prefixes_are_walked_once() -> None:
    model = _model()
    reads = SiteReads(model, SITES)
    reads.read()
    inner = reads._inner or []
    # stream, states, net, layers, [1], [2], inner, [0], cache, k: each once
    assert len(inner) == 10 and len({id(obj) for _, _, obj in inner}) == 10
    assert len(reads._leaves) == len(SITES)
