"""HostConstants (runtime/engine/hoist.py): which host-to-device copies it serves, which it
leaves alone. A ``meta`` engine stands in for a device one on the CPU (a `.to("meta")`
leaves the host as a `.to("cuda")` does)."""

from __future__ import annotations

import torch

from duplexcadence.runtime import CaptureClass, ExactShapeReplay, FakeGraphBackend, TensorSpec
from duplexcadence.runtime.engine.hoist import HostConstants


def test_a_host_constant_copied_to_the_device_is_served_from_one_buffer() -> None:
    mode = HostConstants(torch.device("meta"))
    with mode:
        a = torch.arange(4).to("meta")
        b = torch.arange(4).to("meta")
    assert a.device.type == b.device.type == "meta"
    assert (mode.created, mode.served) == (1, 2)


def test_a_batched_tensor_inside_vmap_is_not_a_constant() -> None:
    """transformers builds attention masks under torch.vmap and moves each to the result's
    device: the batched tensor has no storage to key, so it passes through."""
    mode = HostConstants(torch.device("meta"))
    with mode:
        out = torch.vmap(lambda x: x.to("meta") * 2)(torch.arange(3))
    assert out.device.type == "meta" and out.shape == (3,)
    assert (mode.created, mode.served) == (0, 0)


def test_a_host_engine_hoists_nothing() -> None:
    """On the CPU a `.to(cpu)` is no copy: stock returns the tensor itself, and so must the
    mode (a clone would break code that writes through what it received)."""
    mode = HostConstants(torch.device("cpu"))
    x = torch.arange(4)
    with mode:
        assert x.to("cpu") is x
        torch.tensor([1.0, 2.0], device="cpu")
    assert (mode.created, mode.served) == (0, 0)


def test_a_callable_that_moves_a_vmapped_mask_captures_on_the_fake_backend() -> None:
    """The Qwen3 Code2Wav failure in small: every class failed capture with 'Cannot access
    data pointer of Tensor that doesn't have storage' and ran eager."""

    def masked(x: torch.Tensor) -> torch.Tensor:
        idx = torch.arange(x.shape[-1], device=x.device)
        mask = torch.vmap(lambda i: (idx <= i).to(x.device))(idx)
        return x.masked_fill(~mask, 0.0).sum(-1)

    eng = ExactShapeReplay(
        masked,
        name="masked",
        classes=[CaptureClass("c", (TensorSpec((5, 5), torch.float32),))],
        regions={},
        device="cpu",
        backend=FakeGraphBackend(),
    )
    eng.capture_all(progress=False)
    assert [c["status"] for c in eng.stats()["classes"]] == ["captured"]
    x = torch.randn(5, 5)
    with torch.no_grad():
        assert torch.equal(eng(x), masked(x))
    assert eng.stats()["hits"] == 1
