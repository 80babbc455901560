"""ExactShapeReplay admission, staging, outputs, counters and controls on CPU.

The fake backend "captures" by calling the function once and keeping its outputs
as static outputs, and "replays" by calling it again on the static inputs and
copying into those outputs — so every rule about staging, aliasing and output
ownership is exercised without a GPU.
"""

from __future__ import annotations

import logging

import pytest
import torch

from duplexcadence.runtime import (
    CaptureClass,
    CarryRegion,
    Effect,
    ExactShapeReplay,
    FakeGraphBackend,
    HeadTail,
    Region,
    RegionSpec,
    RegionView,
    ReplayMiss,
    TensorSpec,
    determinism_settings,
    format_report,
    materialize,
    pin_determinism,
    set_replay_enabled,
    set_strict,
    strict,
)

EXTENTS = (2, 4, 6)


@pytest.fixture(autouse=True)
def _reset_controls(monkeypatch):
    monkeypatch.delenv("DUPLEXCADENCE_DISABLE_REPLAY", raising=False)
    monkeypatch.delenv("DUPLEXCADENCE_STRICT", raising=False)
    yield
    set_replay_enabled(None)
    set_strict(None)


class Model:
    """A KV-like carry (aliased), a write-through accumulator, a staged input."""

    def __init__(self):
        self.kv = CarryRegion(
            RegionSpec("kv", torch.float32, (2, 8, 4), 1, "session", "mutable"),
            HeadTail(2, 4),
            "cpu",
        )
        self.acc = torch.zeros(4)
        self.calls = 0

    def step(self, x, kv, *, scale=1.0, **_ignored):
        self.calls += 1
        h = torch.cat([kv, x], dim=1)
        self.acc.add_(h.sum(dim=(0, 1)))  # in-place write into a write-through buffer
        return {"h": h * scale, "kv": kv, "n": h.shape[1], "pair": (h[:, :1] + 1, 7)}


def classes():
    return [
        CaptureClass(
            f"T{t}",
            (TensorSpec((2, 2, 4), torch.float32, "randn"), RegionView("kv", t)),
            {"scale": 0.5},
        )
        for t in EXTENTS
    ]


def engine(model, backend=None, **kw):
    kw.setdefault("classes", classes())
    return ExactShapeReplay(
        model.step,
        name="step",
        regions={"kv": model.kv},
        write_through={"acc": lambda: model.acc},
        device="cpu",
        backend=backend or FakeGraphBackend(),
        **kw,
    )


def prime(model, t, seed=0):
    g = torch.Generator().manual_seed(seed)
    model.kv.adopt(torch.randn(2, t, 4, generator=g))


def x_of(seed):
    return torch.randn(2, 2, 4, generator=torch.Generator().manual_seed(100 + seed))


def test_replay_equals_eager_for_every_class():
    m, ref = Model(), Model()
    eng = engine(m).capture_all(progress=False)
    for i, t in enumerate(EXTENTS):
        prime(m, t, i)
        prime(ref, t, i)
        with torch.no_grad():
            got = eng(x_of(i), m.kv.current(), scale=0.5)
        want = ref.step(x_of(i), ref.kv.current(), scale=0.5)
        assert torch.equal(got["h"], want["h"]) and got["n"] == want["n"] == t + 2
        assert torch.equal(got["pair"][0], want["pair"][0]) and got["pair"][1] == 7
        assert torch.equal(m.acc, ref.acc)  # write-through state advanced identically
    assert eng.hits == 3 and eng.stats()["misses"] == {}
    assert [c["hits"] for c in eng.stats()["classes"]] == [1, 1, 1]


def test_staging_copies_each_call():
    m = Model()
    eng = engine(m).capture_all(progress=False)
    prime(m, 4)
    with torch.no_grad():
        a = eng(x_of(1), m.kv.current(), scale=0.5)["h"]
        b = eng(x_of(2), m.kv.current(), scale=0.5)["h"]
    assert torch.equal(a[:, 4:], x_of(1) * 0.5) and torch.equal(b[:, 4:], x_of(2) * 0.5)


def test_output_rule_clone_non_region_keep_region():
    m = Model()
    eng = engine(m).capture_all(progress=False)
    prime(m, 4)
    with torch.no_grad():
        first = eng(x_of(1), m.kv.current(), scale=0.5)
        held = first["h"].clone()
        second = eng(x_of(2), m.kv.current(), scale=0.5)
    # A later replay must not overwrite what the caller holds ...
    assert torch.equal(first["h"], held)
    assert first["h"].data_ptr() != second["h"].data_ptr()
    # ... while a region-backed output IS the region (same storage, no copy).
    assert first["kv"].data_ptr() == m.kv.data_ptr()
    assert second["kv"].untyped_storage().data_ptr() == m.kv.storage_ptr()


def test_capture_once_before_traffic_and_transparent():
    m = Model()
    b = FakeGraphBackend()
    eng = engine(m, b)
    prime(m, 4)
    kv_before, acc_before, len_before = m.kv.tensor.clone(), m.acc.clone(), m.kv.length
    rng_before = torch.get_rng_state()
    with torch.no_grad():
        eng(x_of(0), m.kv.current(), scale=0.5)  # before capture: eager, counted
    assert eng.stats()["misses"] == {"not_captured": 1} and b.captures == 0
    m.acc.copy_(acc_before)
    eng.capture_all(progress=False)
    # the first class: probe + 1 warm-up; every later class its probe only
    assert b.captures == 3 and b.eager_runs == 2 + 1 + 1
    # fn mutated acc during probe/warm-up/capture: all rewound
    assert torch.equal(m.kv.tensor, kv_before) and torch.equal(m.acc, acc_before)
    assert m.kv.length == len_before and torch.equal(torch.get_rng_state(), rng_before)
    eng.capture_all(progress=False)
    assert b.captures == 3  # idempotent: capture happens once
    with torch.no_grad():
        for i in range(4):
            eng(x_of(i), m.kv.current(), scale=0.5)
    assert b.captures == 3 and b.replays == 4


def test_signature_miss_runs_eager_and_counts():
    m = Model()
    eng = engine(m).capture_all(progress=False)
    prime(m, 3)  # extent 3 is not in the catalog
    with torch.no_grad():
        out = eng(x_of(0), m.kv.current(), scale=0.5)
        eng(x_of(0), m.kv.current(), scale=0.25)  # scalar differs
        eng(x_of(0), m.kv.current(), scale=0.5, extra=object())
    assert out["n"] == 5
    assert eng.stats()["misses"] == {"signature": 2, "unkeyable_argument": 1}
    assert eng.hits == 0


def test_aliased_pointer_miss():
    m = Model()
    eng = engine(m).capture_all(progress=False)
    imposter = torch.zeros(2, 8, 4)[:, :4]  # same shape/strides/alignment, other storage
    with torch.no_grad():
        eng(x_of(0), imposter, scale=0.5)
    assert eng.stats()["misses"] == {"aliased_pointer": 1}
    assert eng.invalidations == 0  # a different argument is not drift


def test_write_through_drift_invalidates_class(caplog):
    m = Model()
    eng = engine(m).capture_all(progress=False)
    caplog.set_level(logging.WARNING, logger="duplexcadence")
    prime(m, 4)
    m.acc = torch.zeros(4)  # the model re-pointed its buffer
    with torch.no_grad():
        eng(x_of(0), m.kv.current(), scale=0.5)
        eng(x_of(0), m.kv.current(), scale=0.5)
    s = eng.stats()
    assert s["invalidations"] == 1 and "invalidation" in caplog.text and "acc" in caplog.text
    assert s["misses"] == {"write_through_pointer": 1, "invalidated": 1}
    assert [c["status"] for c in s["classes"]] == ["captured", "invalidated", "captured"]
    assert float(m.acc.abs().sum()) > 0  # eager ran and wrote the new buffer


def test_grad_mode_runs_eager():
    m = Model()
    eng = engine(m).capture_all(progress=False)
    prime(m, 2)
    eng(x_of(0), m.kv.current(), scale=0.5)
    assert eng.stats()["misses"] == {"grad_enabled": 1}


def test_strict_mode_raises(monkeypatch):
    m = Model()
    eng = engine(m).capture_all(progress=False)
    prime(m, 3)
    with torch.no_grad():
        with strict():
            with pytest.raises(ReplayMiss) as ei:
                eng(x_of(0), m.kv.current(), scale=0.5)
        assert ei.value.reason == "signature"
        eng(x_of(0), m.kv.current(), scale=0.5)  # strict restored: falls back
        monkeypatch.setenv("DUPLEXCADENCE_STRICT", "1")
        with pytest.raises(ReplayMiss):
            eng(x_of(0), m.kv.current(), scale=0.5)
        set_strict(False)  # the API wins over the environment
        eng(x_of(0), m.kv.current(), scale=0.5)
    assert eng.stats()["misses"] == {"signature": 4}


def test_disable_env_captures_nothing(monkeypatch):
    monkeypatch.setenv("DUPLEXCADENCE_DISABLE_REPLAY", "1")
    m, b = Model(), FakeGraphBackend()
    eng = engine(m, b).capture_all(progress=False)
    prime(m, 2)
    with torch.no_grad(), strict():  # disabled is not a miss: strict does not raise
        eng(x_of(0), m.kv.current(), scale=0.5)
    assert b.captures == 0 and b.eager_runs == 0 and not eng.captured
    assert eng.stats()["misses"] == {"disabled": 1} and m.calls == 1


def test_disable_api_after_capture():
    m, b = Model(), FakeGraphBackend()
    eng = engine(m, b).capture_all(progress=False)
    prime(m, 2)
    set_replay_enabled(False)
    with torch.no_grad():
        eng(x_of(0), m.kv.current(), scale=0.5)
    set_replay_enabled(True)
    with torch.no_grad():
        eng(x_of(0), m.kv.current(), scale=0.5)
    assert eng.stats()["misses"] == {"disabled": 1} and eng.hits == 1 and b.replays == 1


def test_non_cuda_device_runs_eager_without_raising():
    m = Model()
    eng = ExactShapeReplay(
        m.step, name="step", classes=classes(), regions={"kv": m.kv}, device="cpu"
    )
    eng.capture_all(progress=False)  # default backend: CUDA graphs
    prime(m, 2)
    with torch.no_grad():
        out = eng(x_of(0), m.kv.current(), scale=0.5)
        assert out["n"] == 4
        with strict(), pytest.raises(ReplayMiss, match="no_cuda"):
            eng(x_of(0), m.kv.current(), scale=0.5)
    assert eng.stats()["rejected"] == "no_cuda" and eng.stats()["misses"] == {"no_cuda": 2}


def test_host_rng_rejected_and_rewound():
    def noisy(x):
        return x + torch.rand(x.shape)

    b = FakeGraphBackend()
    eng = ExactShapeReplay(
        noisy,
        name="noisy",
        classes=[CaptureClass("c", (TensorSpec((3,), torch.float32),))],
        regions={},
        device="cpu",
        backend=b,
    )
    before = torch.get_rng_state()
    eng.capture_all(progress=False)
    assert torch.equal(torch.get_rng_state(), before)  # the probe was rewound
    assert eng.rejected == "host_rng" and b.captures == 0
    with torch.no_grad():
        eng(torch.zeros(3))
    assert eng.stats()["misses"] == {"host_rng": 1}


def _device_rng_engine(declared, draws=True):
    g = torch.Generator().manual_seed(7)  # stands in for the device generator

    def fn(x):
        return x + torch.rand(x.shape, generator=g) if draws else x * 2

    b = FakeGraphBackend(device_generator=g)
    eng = ExactShapeReplay(
        fn,
        name="sine",
        classes=[CaptureClass("c", (TensorSpec((5,), torch.float32),))],
        regions={},
        device="cpu",
        backend=b,
        declared_effect=declared,
    )
    return eng, fn, g


def test_device_rng_admitted_and_replays_match_eager():
    eng, fn, g = _device_rng_engine(Effect.DEVICE_RNG)
    start = g.get_state()
    eng.capture_all(progress=False)
    assert torch.equal(g.get_state(), start)  # capture is transparent for the generator
    x = torch.zeros(5)
    eager = [fn(x) for _ in range(4)]
    after_eager = g.get_state()
    g.set_state(start)
    with torch.no_grad():
        replayed = [eng(x) for _ in range(4)]
    assert all(torch.equal(a, b) for a, b in zip(eager, replayed))
    assert torch.equal(g.get_state(), after_eager)
    assert eng.stats()["effect"] == "device_rng" and eng.hits == 4


@pytest.mark.parametrize("declared,draws", [(Effect.NONE, True), (Effect.DEVICE_RNG, False)])
def test_effect_mismatch_rejected(declared, draws):
    eng, _, _ = _device_rng_engine(declared, draws)
    eng.capture_all(progress=False)
    assert eng.rejected == "effect_mismatch"
    with torch.no_grad(), strict(), pytest.raises(ReplayMiss, match="effect_mismatch"):
        eng(torch.zeros(5))


def test_capture_failure_leaves_class_eager():
    m, b = Model(), FakeGraphBackend()
    b.fail_next_captures = 1
    eng = engine(m, b).capture_all(progress=False)
    assert [c["status"] for c in eng.stats()["classes"]] == ["failed", "captured", "captured"]
    prime(m, 2)
    with torch.no_grad():
        eng(x_of(0), m.kv.current(), scale=0.5)
    prime(m, 4)
    with torch.no_grad():
        eng(x_of(0), m.kv.current(), scale=0.5)
    assert eng.stats()["misses"] == {"capture_failed": 1} and eng.hits == 1


def test_duplicate_signatures_rejected():
    m = Model()
    again = CaptureClass(
        "again", (TensorSpec((2, 2, 4), torch.float32), RegionView("kv", 2)), {"scale": 0.5}
    )
    dup = classes() + [again]  # same shapes as class T2, only the fill differs
    with pytest.raises(ValueError, match="same signature"):
        engine(m, classes=dup).capture_all(progress=False)


def test_report_and_stats_are_plain():
    m = Model()
    eng = engine(m).capture_all(progress=False)
    prime(m, 4)
    with torch.no_grad():
        eng(x_of(0), m.kv.current(), scale=0.5)
    text = format_report([eng, m.kv])
    assert "step" in text and "kv" in text and "T4" in text and "\x1b" not in text
    s = eng.stats()
    assert (
        s["kind"] == "replay"
        and s["hits"] == 1
        and s["classes"][0]["staging_bytes"] == 2 * 2 * 4 * 4
    )
    assert s["staging_bytes"] == 3 * 64 and s["write_through_bytes"] == 4 * 4


def test_progress_bar_quiet_and_loud(capsys):
    engine(Model()).capture_all(progress=False)
    assert capsys.readouterr().err == ""
    engine(Model()).capture_all(progress=True)
    assert "capturing step" in capsys.readouterr().err


def test_pin_determinism_restores_flags():
    before = determinism_settings()
    torch.backends.cudnn.deterministic = False
    try:
        with pytest.raises(KeyError):
            with pin_determinism() as pinned:
                assert torch.backends.cudnn.deterministic is True
                assert pinned["cudnn_deterministic"] is True and "torch" in pinned
                raise KeyError("body fails")
        assert torch.backends.cudnn.deterministic is False
    finally:
        torch.backends.cudnn.deterministic = before["cudnn_deterministic"]


class Slotted:
    """Per-step state in the slots of one region's leading axis (`region r[i]`), as a
    solver hands slot k of its stream cache to the estimator at step k."""

    def __init__(self):
        self.slots = Region.allocate(
            RegionSpec("slots", torch.float32, (3, 2, 4), None, "session", "mutable"), "cpu"
        )
        self.slots.tensor.copy_(torch.arange(24.0).reshape(3, 2, 4))
        self.carry = CarryRegion(
            RegionSpec("carry", torch.float32, (3, 2, 6, 4), 2, "session", "mutable"),
            HeadTail(2, 4),
            "cpu",
        )
        self.carry.adopt(torch.randn(3, 2, 4, 4, generator=torch.Generator().manual_seed(3)))

    def step(self, x, *, cnn, att):
        return x * 2 + cnn + att.sum(dim=1)


def slot_classes(slots=(0, 1)):
    return [
        CaptureClass(
            f"i={i}",
            (TensorSpec((2, 4), torch.float32, "randn"),),
            {"cnn": RegionView("slots", index=i), "att": RegionView("carry", 4, index=i)},
        )
        for i in slots
    ]


def slot_engine(m, backend=None, classes=None):
    return ExactShapeReplay(
        m.step,
        name="slotted",
        classes=classes if classes is not None else slot_classes(),
        regions={"slots": m.slots, "carry": m.carry},
        device="cpu",
        backend=backend or FakeGraphBackend(),
    )


def slot_call(eng, m, i, seed=0):
    x = x_of(seed)[0]
    with torch.no_grad():
        return eng(x, cnn=m.slots.tensor[i], att=m.carry.current()[i])


def test_region_view_index_materialises_one_slot():
    m = Slotted()
    args, kwargs, aliased = materialize(
        slot_classes((1,))[0], {"slots": m.slots, "carry": m.carry}, torch.device("cpu"), None
    )
    assert kwargs["cnn"].data_ptr() == m.slots.tensor[1].data_ptr()
    assert kwargs["att"].shape == (2, 4, 4)
    assert kwargs["att"].data_ptr() == m.carry.view(4)[1].data_ptr()
    assert kwargs["att"].stride() == m.carry.view(4)[1].stride()
    assert {id(kwargs["cnn"]), id(kwargs["att"])} == aliased
    with pytest.raises(IndexError, match="slot 3"):
        materialize(
            slot_classes((3,))[0], {"slots": m.slots, "carry": m.carry}, torch.device("cpu"), None
        )


def test_same_signature_dispatches_by_aliased_slot():
    m, ref = Slotted(), Slotted()
    b = FakeGraphBackend()
    eng = slot_engine(m, b).capture_all(progress=False)
    assert b.captures == 2  # two classes, one signature
    for seed, i in enumerate((1, 0, 1, 1)):
        got = slot_call(eng, m, i, seed)
        want = ref.step(x_of(seed)[0], cnn=ref.slots.tensor[i], att=ref.carry.current()[i])
        assert torch.equal(got, want), f"slot {i} replayed the wrong class"
    s = eng.stats()
    assert s["misses"] == {} and eng.hits == 4
    assert [c["hits"] for c in s["classes"]] == [1, 3]


def test_uncaptured_slot_misses_with_aliased_pointer():
    m = Slotted()
    eng = slot_engine(m).capture_all(progress=False)
    out = slot_call(eng, m, 2)  # slot 2: same shapes as slots 0 and 1, never captured
    assert torch.equal(out, m.step(x_of(0)[0], cnn=m.slots.tensor[2], att=m.carry.current()[2]))
    # slot 0 of one region with slot 1 of the other: no class aliases that pair
    with torch.no_grad():
        eng(x_of(0)[0], cnn=m.slots.tensor[0], att=m.carry.current()[1])
    assert eng.stats()["misses"] == {"aliased_pointer": 2} and eng.hits == 0


def test_failed_slot_misses_as_capture_failed_others_replay():
    m, b = Slotted(), FakeGraphBackend()
    b.fail_next_captures = 1
    eng = slot_engine(m, b).capture_all(progress=False)
    assert [c["status"] for c in eng.stats()["classes"]] == ["failed", "captured"]
    slot_call(eng, m, 0)
    slot_call(eng, m, 1)
    assert eng.stats()["misses"] == {"capture_failed": 1} and eng.hits == 1


def test_same_signature_and_same_slot_rejected():
    m = Slotted()
    dup = slot_classes() + [
        CaptureClass(
            "again",
            (TensorSpec((2, 4), torch.float32),),
            {"cnn": RegionView("slots", index=1), "att": RegionView("carry", 4, index=1)},
        )
    ]
    with pytest.raises(ValueError, match="same signature, alias the same pointers"):
        slot_engine(m, classes=dup).capture_all(progress=False)


def test_staging_bytes_count_the_strided_span_and_offset():
    # a [1, 8, 1] int64 view one element into a [1, 9, 1] buffer, and a [2, 3] view of
    # rows 10 apart: the static buffer must reach the last element, not hold 8 or 6
    view = TensorSpec((1, 8, 1), torch.int64, stride=(9, 1, 1), offset=1)
    rows = TensorSpec((2, 3), torch.float32, stride=(10, 1))
    assert view.nbytes() == (1 + 8) * 8
    assert rows.nbytes() == (1 + 10 + 2) * 4
    t = rows.materialize(torch.device("cpu"), None)
    assert t.untyped_storage().nbytes() == rows.nbytes()
    assert view.materialize(torch.device("cpu"), None).storage_offset() == 1
