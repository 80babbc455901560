"""Carry writeback vs the stock concatenation, audit, snapshot/restore, COW."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from duplexcadence.runtime import (
    CarryRegion,
    CopyOnWrite,
    HeadTail,
    Region,
    RegionSpec,
    Ring,
    Segment,
    Window,
    bitwise_equal,
    first_difference,
)

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.int64]


def spec(shape, axis, dtype=torch.float32, name="carry"):
    return RegionSpec(name, dtype, tuple(shape), axis, "session", "mutable")


def frames(shape, dtype, gen, contiguous=True):
    """Random tensor of ``shape``; optionally a non-contiguous view of it."""
    if not contiguous and len(shape) > 1:
        perm = list(reversed(range(len(shape))))
        base = frames([shape[p] for p in perm], dtype, gen)
        return base.permute(*[perm.index(i) for i in range(len(shape))])
    if dtype.is_floating_point:
        return torch.randn(shape, generator=gen).to(dtype)
    return torch.randint(-1000, 1000, shape, generator=gen, dtype=dtype)


def oracle_headtail(h, axis, p, r):
    n = h.shape[axis]
    idx = list(range(p)) + list(range(n - r, n)) if n > p + r else list(range(n))
    return h.index_select(axis, torch.tensor(idx, dtype=torch.long))


def oracle_window(h, axis, w):
    n = h.shape[axis]
    return h.index_select(axis, torch.arange(max(0, n - w), n))


def oracle_ring(stream, axis, n):
    """Slot j holds the newest absolute frame t with t ≡ j (mod n)."""
    total = stream.shape[axis]
    live = min(total, n)
    idx = [max(t for t in range(total) if t % n == j) for j in range(live)]
    return stream.index_select(axis, torch.tensor(idx, dtype=torch.long))


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_writeback_equals_stock_concatenation(data):
    kind = data.draw(st.sampled_from(["headtail", "window", "ring"]), label="kind")
    dtype = data.draw(st.sampled_from(DTYPES), label="dtype")
    ndim = data.draw(st.integers(1, 3), label="ndim")
    axis = data.draw(st.integers(0, ndim - 1), label="axis")
    dims = [data.draw(st.integers(1, 3)) for _ in range(ndim)]
    if kind == "headtail":
        pol = HeadTail(data.draw(st.integers(0, 5)), data.draw(st.integers(0, 5)))
    elif kind == "window":
        pol = Window(data.draw(st.integers(0, 6)))
    else:
        pol = Ring(data.draw(st.integers(1, 6)))
    cap = pol.capacity + data.draw(st.integers(0, 3), label="envelope slack")
    dims[axis] = cap
    carry = CarryRegion(spec(dims, axis, dtype), pol, "cpu", audit=True)
    ptr = carry.data_ptr()
    gen = torch.Generator().manual_seed(data.draw(st.integers(0, 2**16)))
    stream = None
    for call in range(data.draw(st.integers(1, 5), label="calls")):
        n = data.draw(st.integers(0, pol.capacity + 6), label="length")
        shape = list(dims)
        shape[axis] = n
        h = frames(shape, dtype, gen, contiguous=data.draw(st.booleans()))
        if kind == "ring":
            stream = h if stream is None else torch.cat([stream, h], dim=axis)
            expected = oracle_ring(stream, axis, pol.capacity)
        elif kind == "headtail":
            expected = oracle_headtail(h, axis, pol.head, pol.tail)
        else:
            expected = oracle_window(h, axis, pol.width)
        prev = carry.tensor.narrow(axis, 0, pol.capacity).clone() if pol.appends else None
        stock = pol.reference(h, axis, prev, carry.written)  # the torch.cat reference
        assert bitwise_equal(stock, expected), (kind, call, first_difference(expected, stock))
        out = carry.retain(h)
        assert bitwise_equal(out, expected), (kind, call, first_difference(expected, out))
        # No allocation: the result is the carry's own storage, same address.
        assert carry.data_ptr() == ptr
        if out.numel():  # torch reports data_ptr 0 for empty views
            assert out.data_ptr() == ptr
        assert out.untyped_storage().data_ptr() == carry.storage_ptr()
        assert out.shape[axis] == pol.retained_length(n, carry.written - n if pol.appends else 0)
    # The audit ran the policy's own torch.cat reference beside every call.
    assert carry.audit_checks == carry.retains
    assert carry.audit_divergences == 0


@given(p=st.integers(0, 50), r=st.integers(0, 50), n=st.integers(0, 200))
def test_headtail_plan_arithmetic(p, r, n):
    plan = HeadTail(p, r).plan(n)
    assert sum(s.length for s in plan) == HeadTail(p, r).retained_length(n) == min(n, p + r)
    # destinations tile [0, retained) in storage order
    pos = 0
    for s in plan:
        assert s.dst == pos and 0 <= s.src and s.src + s.length <= n
        pos += s.length


@given(cap=st.integers(1, 40), written=st.integers(0, 500), n=st.integers(0, 100))
def test_ring_plan_writes_each_kept_frame_to_its_slot(cap, written, n):
    slots = {}
    for s in Ring(cap).plan(n, written):
        for k in range(s.length):
            slots[s.dst + k] = written + s.src + k  # absolute frame index
    assert all(t % cap == j for j, t in slots.items())
    assert sorted(slots.values()) == list(range(written + n - min(n, cap), written + n))


def test_retain_is_in_place_and_returns_view():
    carry = CarryRegion(spec((2, 6, 3), 1), HeadTail(2, 2), "cpu")
    h = torch.arange(2 * 9 * 3, dtype=torch.float32).reshape(2, 9, 3)
    out = carry.retain(h)
    assert out.shape == (2, 4, 3)
    assert out.data_ptr() == carry.data_ptr()
    out2 = carry.current()
    assert out2.data_ptr() == out.data_ptr() and out2.shape == out.shape
    assert torch.equal(out, torch.cat([h[:, :2], h[:, -2:]], dim=1))


def test_overlapping_history_is_rejected_and_own_view_is_noop():
    carry = CarryRegion(spec((1, 8), 1), HeadTail(2, 3), "cpu")
    assert carry.retain(carry.current()).shape == (1, 0)  # empty own view: no-op
    carry.retain(torch.arange(4.0).reshape(1, 4))
    own = carry.view(4)
    assert carry.retain(own).data_ptr() == carry.data_ptr()  # no-op, allowed
    assert torch.equal(carry.current(), torch.arange(4.0).reshape(1, 4))
    with pytest.raises(ValueError, match="shares storage"):
        carry.retain(carry.tensor.narrow(1, 1, 7))  # overlapping, undefined copy
    with pytest.raises(ValueError, match="shares storage"):
        carry.retain(carry.view(7))  # own view but longer than P+R: would move frames
    with pytest.raises(ValueError, match="dtype"):
        carry.retain(torch.zeros(1, 3, dtype=torch.float64))
    with pytest.raises(ValueError, match="shape"):
        carry.retain(torch.zeros(2, 3))


def test_adopt_counts_copies_and_skips_own_view():
    carry = CarryRegion(spec((1, 10), 1), HeadTail(3, 4), "cpu")
    prompt = torch.arange(12.0).reshape(1, 12)
    v = carry.adopt(prompt)  # longer than capacity: retention applied
    assert carry.adoptions == 1 and v.data_ptr() == carry.data_ptr()
    assert torch.equal(v, torch.cat([prompt[:, :3], prompt[:, -4:]], dim=1))
    same = carry.adopt(v)
    assert same is v and carry.adoptions == 1  # own view: no copy, not counted
    carry.adopt(torch.ones(1, 5))
    assert carry.adoptions == 2 and carry.length == 5


def test_ring_adopt_restarts_ring():
    carry = CarryRegion(spec((6, 1), 0), Ring(4), "cpu")
    carry.retain(torch.arange(3.0).reshape(3, 1))
    carry.adopt(torch.arange(10.0, 12.0).reshape(2, 1))
    assert carry.written == 2
    assert torch.equal(carry.current().flatten(), torch.tensor([10.0, 11.0]))


def test_reset_and_snapshot_restore_keep_address():
    carry = CarryRegion(spec((1, 6), 1), HeadTail(2, 2), "cpu")
    ptr = carry.data_ptr()
    prompt = torch.tensor([[1.0, 2.0, 3.0]])
    carry.adopt(prompt)
    carry.snapshot()
    saved_nbytes = carry.stats()["saved_nbytes"]
    carry.retain(torch.tensor([[1.0, 2.0, 3.0, 7.0, 8.0, 9.0]]))
    assert torch.equal(carry.current(), torch.tensor([[1.0, 2.0, 8.0, 9.0]]))
    v = carry.restore()
    assert torch.equal(v, prompt) and carry.length == 3 and carry.restores == 1
    carry.snapshot()  # second snapshot reuses the save region
    assert carry.stats()["saved_nbytes"] == saved_nbytes == carry.nbytes
    carry.reset()
    assert carry.length == 0 and not carry.tensor.any()
    assert carry.data_ptr() == ptr
    assert torch.equal(carry.restore(), prompt)


def test_restore_before_snapshot_raises():
    with pytest.raises(RuntimeError, match="snapshot"):
        CarryRegion(spec((1, 4), 1), Window(4), "cpu").restore()


# ---------------------------------------------------------------- the audit
def grow(carry, chunks, width=2):
    """Drive the carry the way a streaming decoder does: cat(carry, new) → retain."""
    for i in range(chunks):
        new = torch.arange(width, dtype=torch.float32).reshape(1, width) + 100 * (i + 1)
        carry.retain(torch.cat([carry.current(), new], dim=1))


def test_audit_catches_wrong_declaration_on_first_divergent_call(caplog):
    # Declared head(2) ++ tail(3), but the released code actually keeps the
    # newest 5 frames (a window). Both keep everything while ℓ ≤ 5: call 1 (ℓ=2)
    # and call 2 (ℓ=4) agree; call 3 (ℓ=6) is the first truncation and diverges.
    stock = Window(5).reference
    carry = CarryRegion(spec((1, 8), 1, name="kv"), HeadTail(2, 3), "cpu", audit=True, stock=stock)
    caplog.set_level(logging.WARNING, logger="duplexcadence")
    grow(carry, 2)
    assert carry.audit_divergences == 0 and carry.audit_checks == 2
    grow(carry, 1)
    assert carry.audit_divergences == 1
    rec = carry.audit_records[0]
    assert rec.region == "kv" and rec.call == 3
    assert rec.index == (0, 0)  # stock drops H[0], the declaration keeps it
    assert "kv" in caplog.text and "call 3" in caplog.text


@dataclass(frozen=True)
class AppendOrderBug(HeadTail):
    """The paper's bug class: tail written before head (agrees until truncation)."""

    def plan(self, incoming, written=0):
        p, r = self.head, self.tail
        if incoming > p + r:
            return (Segment(0, incoming - r, r), Segment(r, 0, p))
        return super().plan(incoming, written)


def test_audit_catches_buggy_writeback_on_first_divergent_call():
    carry = CarryRegion(spec((1, 8), 1, name="est"), AppendOrderBug(2, 3), "cpu", audit=True)
    grow(carry, 3)
    assert [r.call for r in carry.audit_records] == [3]
    grow(carry, 2)
    assert carry.audit_divergences == 3  # keeps diverging once wrong
    assert carry.audit_records[0].index == (0, 0)


def test_audit_off_does_not_compare():
    carry = CarryRegion(spec((1, 8), 1), AppendOrderBug(2, 3), "cpu", audit=False)
    grow(carry, 4)
    assert carry.audit_checks == 0 and carry.audit_divergences == 0


def test_region_view_and_spec_validation():
    r = Region.allocate(spec((3, 5), 1, torch.bfloat16), "cpu")
    assert r.nbytes == 3 * 5 * 2 == r.tensor.nbytes
    v = r.view(2)
    assert v.shape == (3, 2) and v.data_ptr() == r.data_ptr()
    with pytest.raises(ValueError):
        r.view(6)
    with pytest.raises(ValueError):
        RegionSpec("x", torch.float32, (2,), 0, "forever", "mutable")
    assert (
        RegionSpec("x", torch.float32, (2,), -1, "turn", "copy_on_write").mutability
        == "copy-on-write"
    )
    with pytest.raises(ValueError, match="envelope"):
        CarryRegion(spec((1, 4), 1), HeadTail(3, 3), "cpu")


def test_copy_on_write_shares_until_first_write():
    base = Region.allocate(
        RegionSpec("prompt", torch.float32, (4,), 0, "process", "immutable"), "cpu"
    )
    base.tensor.copy_(torch.arange(4.0))
    a, b = CopyOnWrite(base), CopyOnWrite(base)
    assert a.read().data_ptr() == b.read().data_ptr() == base.data_ptr()
    w = a.write()
    assert w.data_ptr() != base.data_ptr() and a.copies == 1
    w.add_(10)
    assert torch.equal(a.read(), torch.arange(4.0) + 10)
    assert torch.equal(b.read(), torch.arange(4.0))  # the other session is untouched
    ptr = w.data_ptr()
    a.reset()
    assert a.read().data_ptr() == ptr and torch.equal(a.read(), torch.arange(4.0))
    base.tensor.mul_(2)  # someone wrote the shared immutable state
    with pytest.raises(RuntimeError, match="written in place"):
        b.read()
