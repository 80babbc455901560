"""Session parameters at run time (runtime/params.py) on the CPU with the fake graph backend.

A toy stream whose prompt length is per session, as Token2Wav's voice prompt: the
stock driver keeps `cat(cache[:p], cache[-R:])` with `p` the session's own prompt
frames. The contract declares `p` in 2..8 (default 4): the catalog at the default,
each value's extents shifted, the carry sized for the largest value. Every session
must replay every call (fake graphs) and equal its solo stock run, whatever value it
binds, the lane it lands on, or how values are evicted and captured again.
"""

from __future__ import annotations

import copy

import pytest
import torch

from duplexcadence.runtime import (
    Aliased,
    CallableDecl,
    CaptureClass,
    ContractDecl,
    FakeGraphBackend,
    HeadTail,
    ParamDecl,
    ParamError,
    RegionDecl,
    RegionSpec,
    RegionView,
    Retains,
    TensorSpec,
    bind_contract,
)

LO, HI, DEFAULT = 2, 8, 4  # prompt frames: the declared domain
R, C, D = 7, 3, 8  # retained tail, frames per chunk, width


class Net(torch.nn.Module):
    def __init__(self, device="cpu") -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        w = (torch.randn(D, D, generator=g) / 3).to(device)
        self.w = torch.nn.Parameter(w, requires_grad=False)
        self.scratch = torch.zeros(HI + R + C, D, device=device)

    def step(self, x, state):
        h = torch.cat([state["cache"], x @ self.w], dim=0)
        self.scratch[: h.shape[0]].copy_(torch.tanh(h))
        return self.scratch[: h.shape[0]].sum(dim=0) + x.sum(), {"cache": h}


class Stream:
    """The vendor object: its own prompt (of any length) and cache, shared `net`."""

    def __init__(self, net: Net, seed: int, frames: int) -> None:
        self.net = net
        g = torch.Generator().manual_seed(1000 + seed)
        self.prompt = torch.randn(frames, D, generator=g).to(net.w.device)
        self.state = {"cache": self.prompt.clone()}

    def chunk(self, x):
        y, new = self.net.step(x, self.state)
        cache, p = new["cache"], self.prompt.shape[0]
        if cache.shape[0] > p + R:  # the stock trim reads the prompt length at run time
            cache = torch.cat([cache[:p], cache[-R:]], dim=0)
        self.state = {"cache": cache}
        return y


def decl(capture=(DEFAULT,), hold=2) -> ContractDecl:
    extents = (DEFAULT, DEFAULT + C, DEFAULT + 2 * C, DEFAULT + R)  # at the default
    return ContractDecl(
        name="toy_params",
        target=None,
        source_sha256="",
        determinism={},
        regions={
            "carry": RegionDecl(
                RegionSpec("carry", torch.float32, (HI + R, D), 0, "turn", "mutable"),
                install="carry",
                retention=HeadTail(DEFAULT, R),
                site=(("attr", "state"), ("key", "cache")),
                shift=(("p", 1),),
                retention_shift=((("p", 1),), ()),
            ),
            "scratch": RegionDecl(
                RegionSpec("scratch", torch.float32, (HI + R + C, D), None, "operator", "mutable"),
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
                        (TensorSpec((C, D), torch.float32), {"cache": RegionView("carry", t)}),
                    )
                    for t in extents
                ),
                aliased=(Aliased("carry", "args", (("index", 1), ("key", "cache")), "carry"),),
                retains=(Retains("carry", (("index", 1), ("key", "cache"))),),
                writes=("scratch",),
            ),
        ),
        params=(ParamDecl("p", LO, HI, DEFAULT, capture=capture, hold=hold),),
    )


def x_of(seed: int, i: int, device="cpu") -> torch.Tensor:
    g = torch.Generator().manual_seed(seed * 100 + i)
    return torch.randn(C, D, generator=g).to(device)


def solo_stock(seed: int, frames: int, n: int, device="cpu") -> list[torch.Tensor]:
    s = Stream(Net(device), seed, frames)
    return [s.chunk(x_of(seed, i, device)) for i in range(n)]


def step_stats(binding) -> dict:
    return binding.stats()["callables"]["step"]


@pytest.mark.parametrize("frames", [LO, 3, DEFAULT, 7, HI])
def test_plain_binding_replays_any_value_exactly(frames):
    s = Stream(Net(), 5, frames)
    binding = bind_contract(
        s, decl(), device="cpu", backend=FakeGraphBackend(), progress=False, params={"p": frames}
    )
    binding.capture(progress=False)
    got = [s.chunk(x_of(5, i)) for i in range(8)]
    assert all(torch.equal(a, b) for a, b in zip(got, solo_stock(5, frames, 8)))
    st = step_stats(binding)
    assert st["hits"] == 8 and st["eager_calls"] == 0, st["misses"]
    assert binding.regions["carry"].retention == HeadTail(frames, R)
    binding.unbind()


def test_a_value_outside_the_domain_is_an_error_at_bind_and_open():
    s = Stream(Net(), 1, DEFAULT)
    with pytest.raises(ParamError, match="outside its declared domain 2..8"):
        bind_contract(s, decl(), device="cpu", backend=FakeGraphBackend(), params={"p": 9})
    with pytest.raises(ParamError, match="unknown session parameter"):
        bind_contract(s, decl(), device="cpu", backend=FakeGraphBackend(), params={"q": 3})
    binding = bind_contract(s, decl(), device="cpu", backend=FakeGraphBackend(), progress=False)
    pool = binding.sessions(lanes=1, progress=False)
    with pytest.raises(ParamError, match="p=1 is outside"):
        pool.open(copy.copy(s), params={"p": 1})
    with pytest.raises(ParamError, match="must be an int"):
        pool.open(copy.copy(s), params={"p": 4.0})
    binding.unbind()


@pytest.mark.parametrize("lanes", [1, 2])
def test_sessions_of_different_values_interleave_exactly_with_bounded_graphs(lanes):
    base = Stream(Net(), 99, DEFAULT)
    binding = bind_contract(
        base, decl(hold=2), device="cpu", backend=FakeGraphBackend(), progress=False
    )
    binding.capture(progress=False)
    pool = binding.sessions(lanes=lanes, progress=False)
    values = {1: 2, 2: 6, 3: 8, 4: DEFAULT}  # seed -> prompt frames
    sessions = {}
    for seed, frames in values.items():
        obj = copy.copy(base)
        own = Stream(base.net, seed, frames)
        obj.prompt, obj.state = own.prompt, own.state
        sessions[seed] = pool.open(obj, seed=seed, params={"p": frames})
    got = {seed: [] for seed in values}
    for i in range(6):
        for seed, s in sessions.items():
            got[seed].append(s.run(s.obj.chunk, x_of(seed, i)))
    for seed, frames in values.items():
        want = solo_stock(seed, frames, 6)
        assert all(torch.equal(a, b) for a, b in zip(got[seed], want)), (seed, frames)
    st = step_stats(binding)
    assert st["eager_calls"] == 0, st["misses"]
    assert st["hits"] == 6 * len(values)
    params = binding.stats()["params"]
    # three values besides the default, two held per lane: captured on first use and
    # evicted again as the values rotate through each lane
    assert params["captures"] >= 3
    assert params["evictions"] > 0
    assert all(len(lane["held"]) <= 2 for lane in params["lanes"])
    assert "eviction" in binding.report()
    binding.unbind()


def test_the_declared_capture_set_is_captured_at_bind():
    base = Stream(Net(), 3, 6)
    binding = bind_contract(
        base,
        decl(capture=(3, 6), hold=4),
        device="cpu",
        backend=FakeGraphBackend(),
        progress=False,
        params={"p": 6},
    )
    binding.capture(progress=False)
    lane = binding.stats()["params"]["lanes"][0]
    assert lane["held"] == ["p=3", "p=6"] and lane["captures"] == 1  # p=6 was the bound one
    got = [base.chunk(x_of(3, i)) for i in range(5)]
    assert all(torch.equal(a, b) for a, b in zip(got, solo_stock(3, 6, 5)))
    assert binding.stats()["params"]["captures"] == 1  # nothing captured while serving
    binding.use({"p": 3})  # a plain binding switches value: already held, no capture
    assert binding.stats()["params"]["captures"] == 1
    binding.unbind()


@pytest.mark.cuda
def test_cuda_sessions_of_different_values_replay_real_graphs_exactly():
    """The same on CUDA graphs: two lanes, values captured on first use on each lane."""
    dev = torch.device("cuda")
    base = Stream(Net(dev), 99, DEFAULT)
    binding = bind_contract(base, decl(hold=2), device=dev, progress=False)
    pool = binding.sessions(lanes=2, progress=False)
    values = {1: 2, 2: 6, 3: 8}
    sessions = {}
    for seed, frames in values.items():
        obj = copy.copy(base)
        own = Stream(base.net, seed, frames)
        obj.prompt, obj.state = own.prompt, own.state
        sessions[seed] = pool.open(obj, seed=seed, params={"p": frames})
    with torch.inference_mode():
        got = {
            seed: [s.run(s.obj.chunk, x_of(seed, i, dev)) for i in range(6)]
            for seed, s in sessions.items()
        }
    for seed, frames in values.items():
        want = solo_stock(seed, frames, 6, dev)
        assert all(torch.equal(a, b) for a, b in zip(got[seed], want)), (seed, frames)
    st = step_stats(binding)
    assert st["eager_calls"] == 0 and st["hits"] == 18, st["misses"]
    assert binding.stats()["params"]["captures"] >= 3
    binding.unbind()
