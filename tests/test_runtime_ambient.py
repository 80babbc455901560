"""Ambient state is part of the signature: every keyed setting, changed after capture,
makes the call miss with reason ``ambient_state`` and a detail naming the setting;
declared autocast states are captured and dispatched to; determinism settings are
set by bind and put back by unbind. CPU, fake graph backend (tests/test_runtime_cuda.py
repeats the flips on a real GPU, where they change bytes)."""

from __future__ import annotations

import pytest
import torch
from ambient_flips import FLIPS, flipped

from duplexcadence.runtime import (
    Autocast,
    CaptureClass,
    ExactShapeReplay,
    FakeGraphBackend,
    ReplayMiss,
    TensorSpec,
    apply_settings,
    restore_settings,
    strict,
)
from duplexcadence.runtime.engine import ambient
from duplexcadence.runtime.serving.binding import Binding


def step(x, w):
    return torch.tanh(x @ w) + 1


def make_engine(ambient=(Autocast(None),)):
    eng = ExactShapeReplay(
        step,
        name="step",
        classes=[
            CaptureClass(
                "one",
                (TensorSpec((4, 8), torch.float32, "randn"), TensorSpec((8, 8), torch.float32)),
            )
        ],
        regions={},
        device="cpu",
        backend=FakeGraphBackend(),
        ambient=ambient,
    )
    return eng.capture_all(progress=False)


def inputs():
    g = torch.Generator().manual_seed(0)
    return torch.randn(4, 8, generator=g), torch.randn(8, 8, generator=g)


def test_every_setting_has_a_flip():
    keyed = set(ambient.names("cpu")) | set(ambient.names("cuda"))
    assert keyed - {"cuda.current_device"} <= set(FLIPS)


@pytest.mark.parametrize("name", [n for n in ambient.names("cpu") if n != "cuda.current_device"])
def test_a_changed_setting_misses_and_names_itself(name):
    eng = make_engine()
    x, w = inputs()
    with torch.no_grad():
        eng(x, w)
        assert eng.hits == 1
        with flipped(name):
            got = eng(x, w)
            want = step(x, w)
        assert torch.equal(got, want)  # the miss ran the callable eagerly, under the flip
        assert eng.misses == {"ambient_state": 1}
        assert f"{name}: captured " in eng.miss_details["ambient_state"]
        eng(x, w)  # back as captured: replays again
    assert eng.hits == 2


def test_strict_mode_names_the_setting():
    eng = make_engine()
    x, w = inputs()
    with torch.no_grad(), strict(), torch.autocast("cpu", dtype=torch.bfloat16):
        with pytest.raises(ReplayMiss, match=r"ambient_state.*autocast\(cpu\): captured disabled"):
            eng(x, w)


def test_declared_autocast_states_are_captured_and_dispatched():
    eng = make_engine(ambient=(Autocast(None), Autocast(torch.bfloat16)))
    s = eng.stats()
    assert [c["name"] for c in s["classes"]] == ["one @autocast=off", "one @autocast=bfloat16"]
    assert [c["status"] for c in s["classes"]] == ["captured", "captured"]
    # the two variants share one set of staging buffers
    assert s["staging_bytes"] == (4 * 8 + 8 * 8) * 4
    x, w = inputs()
    with torch.no_grad():
        eng(x, w)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            got = eng(x, w)
            want = step(x, w)
        assert got.dtype == want.dtype == torch.bfloat16 and torch.equal(got, want)
        with torch.autocast("cpu", dtype=torch.float16):  # not declared
            eng(x, w)
    assert [c["hits"] for c in eng.stats()["classes"]] == [1, 1]
    assert eng.misses == {"ambient_state": 1}
    assert "captured disabled, now enabled float16" in eng.miss_details["ambient_state"]


def test_signature_miss_names_the_argument_and_both_shapes():
    eng = make_engine()
    with torch.no_grad():
        eng(torch.zeros(4, 8), torch.zeros(8, 8).t())
        eng(torch.zeros(5, 8), torch.zeros(8, 8))
    assert eng.misses == {"signature": 2}
    # the first miss is explained (and logged); later ones only counted
    assert eng.miss_details["signature"] == "args[1]: stride captured (8, 1), live (1, 8)"


def test_bind_settings_are_restored_by_unbind():
    before = torch.backends.cudnn.deterministic
    record = apply_settings({"cudnn.deterministic": not before})
    assert torch.backends.cudnn.deterministic is (not before)
    b = Binding("c", "cpu", determinism=record)
    b.unbind()
    assert torch.backends.cudnn.deterministic is before
    with pytest.raises(ValueError, match="unknown determinism setting"):
        apply_settings({"cudnn.fast": True})
    restore_settings({})  # nothing to restore is fine


def test_an_attention_backend_can_be_pinned_and_comes_back():
    """``determinism cuda.cudnn_sdp = false`` (contracts/moshi.clock): bind switches
    cuDNN's attention off, unbind puts it back; a replay keys on it."""
    before = torch.backends.cuda.cudnn_sdp_enabled()
    key = ambient.ambient_state("cuda")
    record = apply_settings({"cuda.cudnn_sdp": not before})
    assert torch.backends.cuda.cudnn_sdp_enabled() is (not before)
    assert record["in_force"] == {"cuda.cudnn_sdp": not before}
    assert (
        ambient.ambient_state("cuda") != key
    )  # a graph captured under one would miss under the other
    Binding("c", "cpu", determinism=record).unbind()
    assert torch.backends.cuda.cudnn_sdp_enabled() is before


def _two_state_decl():
    from duplexcadence.runtime import CallableDecl, ContractDecl

    cls = CaptureClass(
        "one", (TensorSpec((4, 8), torch.float32, "randn"), TensorSpec((8, 8), torch.float32))
    )
    return ContractDecl(
        name="toy_ambient",
        target=None,
        source_sha256="",
        determinism={},
        regions={},
        callables=(
            CallableDecl(
                "step",
                site=(("attr", "step"),),
                classes=(cls,),
                ambient=(Autocast(None), Autocast(torch.bfloat16)),
            ),
        ),
    )


def test_a_deployment_captures_only_the_autocast_states_it_serves():
    """``bind(ambient=("off",))``: a float32 deployment never meets the declared
    bfloat16 state, so its classes are not captured (half the capture at bind); a call
    under it all the same runs eager, counted."""
    import types

    from duplexcadence.runtime import bind_contract

    model = types.SimpleNamespace(step=step)
    b = bind_contract(model, _two_state_decl(), backend="simulate", progress=False, ambient=["off"])
    s = b.stats()["callables"]["step"]
    assert [c["name"] for c in s["classes"]] == ["one"] and s["ambient"] == ["off"]
    x, w = inputs()
    with torch.no_grad():
        assert torch.equal(model.step(x, w), step(x, w))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert torch.equal(model.step(x, w), step(x, w))
    s = b.stats()["callables"]["step"]
    assert s["hits"] == 1 and s["misses"] == {"ambient_state": 1}
    b.unbind()
    every = bind_contract(model, _two_state_decl(), backend="simulate", progress=False)
    assert len(every.stats()["callables"]["step"]["classes"]) == 2
    every.unbind()
    with pytest.raises(ValueError, match=r"declares the autocast states \['bfloat16', 'off'\]"):
        bind_contract(model, _two_state_decl(), backend="simulate", ambient=["float16"])
    with pytest.raises(TypeError, match="collection of autocast labels"):
        bind_contract(model, _two_state_decl(), backend="simulate", ambient="off")
    assert model.step is step  # a refused bind leaves the model as it was
