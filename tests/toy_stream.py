"""A synthetic streaming model with the state patterns of the real ones, for session
tests on the CPU (tests/test_runtime_sessions.py) and on a GPU (test_runtime_cuda.py).

A per-session carry (head ++ tail retention, trimmed by the stock driver after the
call, aliased by the callable), a write-through scratch buffer at a site of the shared
module, shared weights, and optionally a device-random draw per call (as HiFT's
SineGen): ``noise=True`` on CUDA makes the callable's effect ``device_rng``.
"""

from __future__ import annotations

import dataclasses

import torch

from duplexcadence.runtime import (
    Aliased,
    CallableDecl,
    CaptureClass,
    ContractDecl,
    Effect,
    HeadTail,
    RegionDecl,
    RegionSpec,
    RegionView,
    Retains,
    TensorSpec,
)

P, R, C, D = 4, 7, 3, 8  # prompt frames, retained tail, frames per chunk, width
EXTENTS = (P, P + C, P + 2 * C, P + R)  # 4, 7, 10, 11: from chunk 3 on trimmed to P + R


class Net(torch.nn.Module):
    """Shared weights, a scratch buffer the stock step writes in place, and a conv
    state buffer (as the DiT's ``cnn_cache_buffer``): the step writes the new conv state
    into it and returns a view of it, which the driver keeps as session state."""

    def __init__(self, device="cpu", noise: bool = False) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        w = (torch.randn(D, D, generator=g) / 3).to(device)
        self.w = torch.nn.Parameter(w, requires_grad=False)
        self.scratch = torch.zeros(P + R + C, D, device=device)
        self.conv_buf = torch.zeros(2, D, device=device)
        self.noise = noise

    def step(self, x, state):
        # the per-session state comes in as the session's own dict (as Token2wav passes
        # `cache=self.stream_cache`), which the binder updates in place
        h = torch.cat([state["cache"], x @ self.w], dim=0)
        self.scratch[: h.shape[0]].copy_(torch.tanh(h))
        y = self.scratch[: h.shape[0]].sum(dim=0) + x.sum() + state["conv"].sum(dim=0)
        if self.noise:
            y = y + torch.rand(D, device=x.device)  # device randomness on every call
        self.conv_buf.copy_(torch.stack([state["conv"][1], x[-1]]) * 0.5)
        return y, {"cache": h, "conv": self.conv_buf}


class Stream:
    """The vendor's per-session object: its own cache, shared `net`."""

    def __init__(self, net: Net, seed: int) -> None:
        self.net = net
        g = torch.Generator().manual_seed(1000 + seed)
        self.prompt = torch.randn(P, D, generator=g).to(net.w.device)
        self.prime()

    def prime(self) -> None:
        self.state = {"cache": self.prompt.clone(), "conv": self.prompt[:2] * 0.1}

    def chunk(self, x):
        y, new = self.net.step(x, self.state)
        cache = new["cache"]
        if cache.shape[0] > P + R:  # the stock trim, after the call (as Token2wav.stream)
            cache = torch.cat([cache[:P], cache[-R:]], dim=0)
        self.state = {"cache": cache, "conv": new["conv"]}
        return y


def decl(noise: bool = False, declare_conv: bool = True) -> ContractDecl:
    """``declare_conv=False`` leaves the conv buffer out: the step then writes model
    state the contract does not know about (what a second lane must refuse)."""
    d = ContractDecl(
        name="toy",
        target=None,
        source_sha256="",
        determinism={},
        regions={
            "carry": RegionDecl(
                RegionSpec("carry", torch.float32, (P + R, D), 0, "turn", "mutable"),
                install="carry",
                retention=HeadTail(P, R),
                site=(("attr", "state"), ("key", "cache")),
            ),
            "conv": RegionDecl(
                RegionSpec("conv", torch.float32, (2, D), None, "turn", "mutable"),
                install="allocate",
                site=(("attr", "net"), ("attr", "conv_buf")),
            ),
            "scratch": RegionDecl(
                RegionSpec("scratch", torch.float32, (P + R + C, D), None, "operator", "mutable"),
                install="allocate",
                site=(("attr", "net"), ("attr", "scratch")),
            ),
        },
        callables=(
            CallableDecl(
                "step",
                site=(("attr", "net"), ("attr", "step")),
                classes=tuple(
                    CaptureClass(
                        f"carry={t}",
                        (
                            TensorSpec((C, D), torch.float32),
                            {"cache": RegionView("carry", t), "conv": RegionView("conv")},
                        ),
                    )
                    for t in EXTENTS
                ),
                effect=Effect.DEVICE_RNG if noise else Effect.NONE,
                aliased=(
                    Aliased("carry", "args", (("index", 1), ("key", "cache")), "carry"),
                    Aliased("conv", "args", (("index", 1), ("key", "conv")), "prefix"),
                ),
                retains=(Retains("carry", (("index", 1), ("key", "cache"))),),
                writes=("scratch", "conv"),
            ),
        ),
    )
    if declare_conv:
        return d
    regions = {n: r for n, r in d.regions.items() if n != "conv"}
    (k,) = d.callables
    k = dataclasses.replace(
        k,
        classes=tuple(
            dataclasses.replace(
                c,
                args=(
                    c.args[0],
                    {"cache": c.args[1]["cache"], "conv": TensorSpec((2, D), torch.float32)},
                ),
            )
            for c in k.classes
        ),
        aliased=tuple(a for a in k.aliased if a.region != "conv"),
        writes=("scratch",),
    )
    return dataclasses.replace(d, regions=regions, callables=(k,))


def x_of(seed: int, i: int, device="cpu") -> torch.Tensor:
    g = torch.Generator().manual_seed(seed * 100 + i)
    return torch.randn(C, D, generator=g).to(device)


def solo_stock(
    seed: int, n: int, reset_at: tuple[int, ...] = (), device="cpu", noise: bool = False
) -> list[torch.Tensor]:
    """The session run alone on the unbound stock code (device randomness seeded)."""
    s = Stream(Net(device, noise), seed)
    if noise:
        torch.cuda.manual_seed(seed)
    out = []
    for i in range(n):
        if i in reset_at:
            s.prime()
        out.append(s.chunk(x_of(seed, i, device)))
    return out
