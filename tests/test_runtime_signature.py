"""Signatures and the pure catalog dispatch (admission clause (i))."""

from __future__ import annotations

import enum

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from duplexcadence.runtime import CatalogDispatch, Miss, signature_of
from duplexcadence.runtime.engine.signature import signature_and_leaves


class Mode(enum.Enum):
    A = 1
    B = 2


def sig(*args, **kwargs):
    return signature_of(args, kwargs)


def test_tensor_metadata_distinguishes():
    t = torch.zeros(4, 6)
    assert sig(t) == sig(torch.ones(4, 6))  # data never matters
    assert sig(t) != sig(torch.zeros(6, 4))  # shape
    assert sig(t) != sig(torch.zeros(6, 4).t())  # same shape, other strides
    assert sig(t) != sig(torch.zeros(4, 6, dtype=torch.float16))  # dtype
    assert sig(t) != sig(torch.zeros(4, 6, requires_grad=True))  # autograd
    assert sig(t) != sig(torch.zeros(4, 6, device="meta"))  # device


def test_storage_offset_not_keyed_but_alignment_is():
    base = torch.zeros(64)
    fresh = torch.zeros(8)
    assert sig(base[16:24]) == sig(fresh)  # offset 64 bytes: same alignment class
    assert sig(base[1:9]) != sig(fresh)  # offset 4 bytes: a misaligned view misses


def test_never_reads_data():
    # meta tensors have no data at all; any data read would raise.
    s = sig(torch.empty(3, 5, device="meta"), k=torch.empty(2, device="meta"))
    assert isinstance(s, tuple)


@given(st.lists(st.floats(allow_nan=True), min_size=1, max_size=5))
def test_data_independent(values):
    a = torch.tensor(values)
    assert sig(a) == sig(torch.zeros(len(values)))


def test_scalars_keyed_by_type_and_exact_value():
    assert sig(1) != sig(True)  # bool is not int
    assert sig(1) != sig(1.0)
    assert sig(0.0) != sig(-0.0)
    assert sig(float("nan")) == sig(float("nan"))  # a hashable exact key
    assert sig(None) != sig(0)
    assert sig("a") != sig("b")
    assert sig(Mode.A) != sig(Mode.B)
    assert sig(torch.float32) != sig(torch.float16)
    assert sig(torch.device("cpu")) != sig(torch.device("meta"))


def test_structure_and_keyword_order():
    t = torch.zeros(2)
    assert sig(x=t, y=1) == signature_of((), {"y": 1, "x": t})
    assert sig({"b": 1, "a": t}) == sig({"a": t, "b": 1})
    assert sig({2: t, "a": 1, 1: t}) == sig({"a": 1, 1: t, 2: t})  # int and str keys
    assert sig({1: t, "a": 1}) != sig({"1": t, "a": 1})
    assert sig([t, 1]) != sig((t, 1))
    assert sig((t,), 1) != sig(t, 1)
    assert sig(t, y=1) != sig(t, 1)  # positional vs keyword


def test_leaves_in_signature_order():
    a, b, c = torch.zeros(1), torch.zeros(2), torch.zeros(3)
    _, leaves = signature_and_leaves((a, {"z": b, "y": c}), {"k": a})
    assert [x.numel() for x in leaves] == [1, 3, 2, 1]  # dict keys sorted: y before z


def test_unkeyable_always_misses():
    cat = CatalogDispatch({sig(torch.zeros(2)): "c0"})
    for bad in (object(), lambda: 1, {(1, 2): 3}, torch.zeros(2).to_sparse()):
        s = sig(torch.zeros(2), bad)
        assert cat.lookup(s) == Miss("unkeyable_argument")
    with pytest.raises(ValueError, match="unkeyable"):
        CatalogDispatch({sig(object()): "x"})


def test_dispatch_hit_miss_drop():
    keys = {sig(torch.zeros(2, n)): f"T{n}" for n in (3, 5)}
    cat = CatalogDispatch(keys)
    assert cat.lookup(sig(torch.ones(2, 5))) == "T5"
    assert cat.lookup(sig(torch.ones(2, 4))) == Miss("signature")
    cat.drop(sig(torch.zeros(2, 5)), "invalidated")
    assert cat.lookup(sig(torch.ones(2, 5))) == Miss("invalidated")
    assert cat.lookup(sig(torch.ones(2, 3))) == "T3"
    assert len(cat) == 1
    with pytest.raises(ValueError, match="duplicate"):
        CatalogDispatch([(sig(1), "a"), (sig(1), "b")])
    dropped = CatalogDispatch({}, dropped={sig(2): "capture_failed"})
    assert dropped.lookup(sig(2)) == Miss("capture_failed")


def test_class_key_may_be_falsy():
    cat = CatalogDispatch({sig(1): 0})
    assert cat.lookup(sig(1)) == 0


def test_size_one_strides_do_not_split_signatures():
    """A `clone()` of a slice keeps the parent's stride on size-1 dims: same layout."""
    import torch

    from duplexcadence.runtime import signature_of

    source = torch.zeros(1, 1, 9000)
    cloned_slice = source[:, :, -3840:].clone()
    fresh = torch.zeros(1, 1, 3840)
    assert cloned_slice.stride() != fresh.stride()
    assert signature_of((cloned_slice,), {}) == signature_of((fresh,), {})
    # a real layout difference still splits
    assert signature_of((torch.zeros(4, 3).t(),), {}) != signature_of((torch.zeros(3, 4),), {})
