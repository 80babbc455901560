"""Session parameters at run time (runtime/serving/params.py) on the CPU with the fake graph backend.

A toy stream whose prompt length is per session, as Token2Wav's voice prompt: the
stock driver keeps `cat(cache[:p], cache[-R:])` with `p` the session's own prompt
frames. The contract declares `p` in 2..8 (default 4): the catalog at the default,
each value's extents shifted, the carry sized for the largest value. Every session
must replay every call (fake graphs) and equal its solo stock run, whatever value it
binds, the lane it lands on, or how values are evicted and captured again.
"""

from __future__ import annotations

import copy
import threading
import time

import pytest
import torch

from duplexcadence.runtime.state.layouts import moved_view
from duplexcadence.runtime.serving.params import resolve, shape_at
from duplexcadence.runtime.state.sites import get_at
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
                shape_shift=((("p", 1),), ()),  # the shape above is the domain's largest
            ),
            "scratch": RegionDecl(
                RegionSpec("scratch", torch.float32, (HI + R + C, D), None, "operator", "mutable"),
                install="allocate",
                site=(("attr", "net"), ("attr", "scratch")),
                shape_shift=((("p", 1),), ()),
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
def test_sessions_of_different_values_interleave_exactly_and_no_step_captures(lanes):
    """Four values on one or two lanes, two held per lane: a step whose value has no
    graphs on a free lane runs eager (exact, counted) and the pool captures the value
    between steps (from its session's opening on); lanes are laid out for the whole
    domain when the pool opens, so no step grows one either."""
    base = Stream(Net(), 99, DEFAULT)
    binding = bind_contract(
        base, decl(hold=2), device="cpu", backend=FakeGraphBackend(), progress=False
    )
    binding.capture(progress=False)
    pool = binding.sessions(lanes=lanes, progress=False)
    grown_at_open = binding.stats()["params"]["regrows"]
    assert grown_at_open == lanes  # each lane re-laid for the domain once, before traffic
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
        assert pool.wait_for_captures(10.0)  # rounds apart: what replays is deterministic
    for seed, frames in values.items():
        want = solo_stock(seed, frames, 6)
        assert all(torch.equal(a, b) for a, b in zip(got[seed], want)), (seed, frames)
    st = step_stats(binding)
    assert set(st["misses"]) <= {"value_not_captured"}, st["misses"]
    assert st["hits"] + st["misses"].get("value_not_captured", 0) == 6 * len(values)
    # how many steps ran eager depends on whether a value's capture (started when its
    # session opened) finished before its first step: any count is exact
    assert st["hits"] > 0
    params, sessions_stats = binding.stats()["params"], binding.stats()["sessions"]
    assert params["regrows"] == grown_at_open  # no step grew a lane
    assert sessions_stats["background_captures"] >= 3 and sessions_stats["capture_errors"] == 0
    assert sessions_stats["affinity_misses"] == st["misses"].get("value_not_captured", 0)
    assert sessions_stats["eager_steps"] == sessions_stats["affinity_misses"]
    assert params["evictions"] > 0 and all(len(lane["held"]) <= 2 for lane in params["lanes"])
    assert "eviction" in binding.report() and "captured between steps" in binding.report()
    # every lane at the domain's top: carry p + 7 frames and scratch 3 more, p = 8
    lane_bytes = sessions_stats["lane_region_bytes"]
    assert lane_bytes == [(2 * (HI + R) + C) * D * 4] * lanes
    binding.unbind()


def test_a_value_is_captured_when_its_session_opens_and_values_follow_their_lanes():
    """Two lanes, two values: the second value is captured when its session opens
    (before its first step); each value's steps then go to the lane holding it
    (affinity), and a value of one session among two is captured on one lane only."""
    base = Stream(Net(), 7, DEFAULT)
    binding = bind_contract(base, decl(hold=4), device="cpu", backend="simulate", progress=False)
    pool = binding.sessions(lanes=2, progress=False)
    one = pool.open(_own(base, 1, DEFAULT), seed=1, params={"p": DEFAULT})
    two = pool.open(_own(base, 2, 6), seed=2, params={"p": 6})
    assert pool.wait_for_captures(10.0)
    out = {1: [], 2: []}
    for i in range(5):
        for seed, s in ((1, one), (2, two)):
            out[seed].append(s.run(s.obj.chunk, x_of(seed, i)))
        assert pool.wait_for_captures(10.0)
    assert all(torch.equal(a, b) for a, b in zip(out[1], solo_stock(1, DEFAULT, 5)))
    assert all(torch.equal(a, b) for a, b in zip(out[2], solo_stock(2, 6, 5)))
    st = binding.stats()["sessions"]
    assert st["affinity_misses"] == 0 and st["background_captures"] == 1  # p=6, once
    assert st["affinity_hits"] == 10
    held = [set(lane["held"]) for lane in binding.stats()["params"]["lanes"]]
    assert sum("p=6" in h for h in held) == 1
    binding.unbind()


def test_caller_threads_with_their_own_values_race_the_captures_exactly():
    """Eight caller threads, each a session with its own value, on three lanes: steps and
    background captures interleave however the threads run; every session equals its
    solo stock run, and nothing raises or hangs."""
    from threads import run_clients

    base = Stream(Net(), 70, DEFAULT)
    binding = bind_contract(base, decl(hold=3), device="cpu", backend="simulate", progress=False)
    pool = binding.sessions(lanes=3, progress=False)
    values = {70 + i: LO + i % (HI - LO + 1) for i in range(8)}
    got: dict[int, list] = {}

    def client(seed: int) -> None:
        s = pool.open(_own(base, seed, values[seed]), seed=seed, params={"p": values[seed]})
        got[seed] = [s.run(s.obj.chunk, x_of(seed, i)) for i in range(8)]
        s.close()

    errors = run_clients(client, values, timeout_s=60)
    assert not errors, errors
    for seed, frames in values.items():
        assert all(torch.equal(a, b) for a, b in zip(got[seed], solo_stock(seed, frames, 8)))
    st = step_stats(binding)
    assert st["hits"] + st["misses"].get("value_not_captured", 0) == 64, st["misses"]
    assert pool.wait_for_captures(10.0) and binding.stats()["sessions"]["capture_errors"] == 0
    binding.unbind()


def test_a_pool_serving_values_up_to_a_bound_has_smaller_lanes_and_refuses_above_it():
    base = Stream(Net(), 8, DEFAULT)
    binding = bind_contract(base, decl(), device="cpu", backend="simulate", progress=False)
    pool = binding.sessions(lanes=2, progress=False, params_up_to={"p": 6})
    assert pool.stats()["lane_region_bytes"] == [(2 * (6 + R) + C) * D * 4] * 2
    with pytest.raises(ParamError, match="serves p up to 6"):
        pool.open(_own(base, 9, HI), params={"p": HI})
    s = pool.open(_own(base, 9, 6), seed=9, params={"p": 6})
    got = [s.run(s.obj.chunk, x_of(9, i)) for i in range(4)]
    assert all(torch.equal(a, b) for a, b in zip(got, solo_stock(9, 6, 4)))
    with pytest.raises(ParamError, match="outside its declared domain"):
        bind_contract(base, decl(), device="cpu", backend="simulate", progress=False).sessions(
            lanes=1, params_up_to={"p": 99}
        )
    binding.unbind()


def _own(base: "Stream", seed: int, frames: int) -> "Stream":
    obj = copy.copy(base)
    own = Stream(base.net, seed, frames)
    obj.prompt, obj.state = own.prompt, own.state
    return obj


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


def region_bytes(binding) -> int:
    return sum(r.nbytes for r in binding.regions.values())


def test_a_plain_binding_at_the_default_allocates_what_the_default_needs():
    """Not the domain's top: the carry at 4 + 7 frames, the scratch 3 more (what the
    contract allocated before it had parameters); Token2Wav's from its contract."""
    s = Stream(Net(), 2, DEFAULT)
    binding = bind_contract(s, decl(), device="cpu", backend=FakeGraphBackend(), progress=False)
    assert binding.regions["carry"].tensor.shape == (DEFAULT + R, D)
    assert region_bytes(binding) == (2 * (DEFAULT + R) + C) * D * 4
    binding.unbind()
    from generated.stepaudio2_token2wav.contract import DECLARED as t2w

    key = resolve(t2w.params, None)
    at = {n: shape_at(t2w, r, key) for n, r in t2w.regions.items()}
    assert at["estimator_carry"] == (10, 16, 2, 8, 302 + 100, 128)
    assert at["solver_workspace"] == (10, 16, 2, 8, 402 + 56, 128)
    assert at["conformer_carry"] == (10, 1, 8, 402, 128)
    top = resolve(t2w.params, {"f_prompt": 600})
    assert {n: shape_at(t2w, r, top) for n, r in t2w.regions.items()} == {
        n: r.spec.shape for n, r in t2w.regions.items()
    }


def test_a_plain_binding_grows_for_a_larger_value_and_keeps_its_state():
    """Three chunks at the default, the lane grown for p=8 (regions re-laid, graphs
    captured again), back at the default: the stream goes on as stock, every call
    replayed, the carry's live frames carried over and the site moved along."""
    s = Stream(Net(), 4, DEFAULT)
    binding = bind_contract(s, decl(), device="cpu", backend=FakeGraphBackend(), progress=False)
    binding.capture(progress=False)
    got = [s.chunk(x_of(4, i)) for i in range(3)]
    binding.use({"p": HI})
    assert binding.stats()["params"]["regrows"] == 1
    assert binding.regions["carry"].tensor.shape == (HI + R, D)
    assert region_bytes(binding) == (2 * (HI + R) + C) * D * 4
    assert s.net.scratch is binding.regions["scratch"].tensor  # re-installed at its site
    binding.use({"p": DEFAULT})  # smaller: views of the grown lane, no regrow
    got += [s.chunk(x_of(4, i)) for i in range(3, 7)]
    assert all(torch.equal(a, b) for a, b in zip(got, solo_stock(4, DEFAULT, 7)))
    st = step_stats(binding)
    assert st["hits"] == 7 and st["eager_calls"] == 0, st["misses"]
    assert binding.stats()["params"]["regrows"] == 1
    binding.unbind()


@pytest.mark.parametrize("lanes", [1, 2])
def test_a_sessions_storage_is_its_own_values_shape(lanes):
    base = Stream(Net(), 50, DEFAULT)
    binding = bind_contract(base, decl(), device="cpu", backend=FakeGraphBackend(), progress=False)
    binding.capture(progress=False)
    pool = binding.sessions(lanes=lanes, progress=False)
    sessions = {}
    for seed, frames in {51: LO, 52: HI, 53: DEFAULT}.items():
        obj = copy.copy(base)
        own = Stream(base.net, seed, frames)
        obj.prompt, obj.state = own.prompt, own.state
        sessions[seed] = (frames, pool.open(obj, seed=seed, params={"p": frames}))
    got = {seed: [] for seed in sessions}
    for i in range(4):
        for seed, (_, s) in sessions.items():
            got[seed].append(s.run(s.obj.chunk, x_of(seed, i)))
        assert pool.wait_for_captures(10.0)
    for seed, (frames, s) in sessions.items():
        assert s.nbytes() == (frames + R) * D * 4  # the carry at its value, not the top
        assert s.storage["carry"].tensor.shape == (frames + R, D)
        assert all(torch.equal(a, b) for a, b in zip(got[seed], solo_stock(seed, frames, 4)))
    st = step_stats(binding)
    # the two values off the default run eager until captured between rounds
    assert st["hits"] + st["misses"].get("value_not_captured", 0) == 12, st["misses"]
    assert set(st["misses"]) <= {"value_not_captured"} and st["hits"] > 0
    stats = pool.stats()
    assert stats["session_bytes"] == sum((f + R) * D * 4 for f, _ in sessions.values())
    assert stats["layout_fallbacks"] == 0
    binding.unbind()


def test_views_move_between_layouts_when_they_keep_the_regions_strides():
    lane = torch.arange(15 * 4.0).reshape(15, 4)  # a lane's region at the top
    mine = torch.zeros(9, 4)  # a session's copy at a smaller value
    view = lane[:6]  # the carry's live view: a narrow along the clock axis
    moved = moved_view(view, (15, 4), mine)
    assert moved is not None and moved.data_ptr() == mine.data_ptr()
    moved.copy_(view)
    assert torch.equal(mine[:6], lane[:6])
    inner = lane[2:5, 1:3]  # a narrow along both dims
    back = moved_view(inner, (15, 4), mine)
    assert back is not None and back.storage_offset() == 2 * 4 + 1
    assert moved_view(lane[:12], (15, 4), mine) is None  # does not fit the smaller copy
    assert moved_view(lane[:6].t(), (15, 4), mine) is None  # other strides: no image
    assert moved_view(lane.view(-1)[:8], (15, 4), mine) is None


@pytest.mark.cuda
def test_cuda_sessions_of_different_values_replay_real_graphs_exactly():
    """The same on CUDA graphs: two lanes laid out for the domain, values captured by the
    pool's capture thread (real graphs, on a lane out of rotation) while the other
    lane's sessions keep stepping; every session exact, whichever of its steps replayed."""
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
    got = {seed: [] for seed in values}
    with torch.inference_mode():
        for i in range(6):  # no wait between rounds: steps race the captures
            for seed, s in sessions.items():
                got[seed].append(s.run(s.obj.chunk, x_of(seed, i, dev)))
    for seed, frames in values.items():
        want = solo_stock(seed, frames, 6, dev)
        assert all(torch.equal(a, b) for a, b in zip(got[seed], want)), (seed, frames)
    st = step_stats(binding)
    assert set(st["misses"]) <= {"value_not_captured"}, st["misses"]
    assert st["hits"] + st["misses"].get("value_not_captured", 0) == 18
    assert pool.wait_for_captures(60.0)
    stats = binding.stats()
    assert stats["sessions"]["background_captures"] >= 1, stats["sessions"]
    assert stats["sessions"]["capture_errors"] == 0
    assert stats["params"]["regrows"] == 2  # each lane once, when the pool opened
    binding.unbind()


def test_a_lanes_graphs_are_evicted_past_its_memory_budget():
    from duplexcadence.runtime.serving.params import ValueGraphs

    class Engine:
        def __init__(self, nbytes):
            self.nbytes, self.released = nbytes, False

        def stats(self):
            return {"capture_allocated_bytes": self.nbytes, "classes": []}

        def release(self):
            self.released = True

    held = ValueGraphs(hold=None, budget_bytes=250)
    keys = [(("p", v),) for v in (2, 3, 4)]
    engines = [Engine(100), Engine(100), Engine(100)]
    assert held.put(keys[0], {"step": engines[0]}) == []
    assert held.put(keys[1], {"step": engines[1]}) == []
    held.get(keys[0])  # used: the other one is the least recently used
    assert held.put(keys[2], {"step": engines[2]}) == [keys[1]] and engines[1].released
    assert held.graph_bytes() == 200 and held.evictions == 1
    alone = ValueGraphs(hold=None, budget_bytes=10)
    assert alone.put(keys[0], {"step": Engine(100)}) == []  # the value in use always stays


def test_a_background_capture_lets_waiting_eager_steps_run_between_its_classes():
    """A capture holds the eager lock (it swaps its lane's regions into the model's
    sites); between two classes it lets a waiting eager section run, with the sites
    back at the eager scratch, then takes the lock and its sites up again."""
    base = Stream(Net(), 5, DEFAULT)
    binding = bind_contract(base, decl(), device="cpu", backend="simulate", progress=False)
    pool = binding.sessions(lanes=2, progress=False)
    capturing_lane, stepping_lane = pool.lanes[1], pool.lanes[0]
    site = next(r.site for r in binding.decl.regions.values() if r.install == "allocate")
    scratch = get_at(base, site)
    events: list = []
    entered = threading.Event()

    def eager_step() -> None:
        entered.set()
        with binding.eager_section(stepping_lane):
            events.append(("step", get_at(base, site) is scratch))

    with binding.capturing(capturing_lane) as section:
        assert get_at(base, site) is not scratch  # the capturing lane's region
        step = threading.Thread(target=eager_step)
        step.start()
        entered.wait(5)
        while not binding.eager_lock.waiting():
            time.sleep(0.001)
        events.append("class 1")
        section.pause()
        step.join(5)
        events.append(("class 2", get_at(base, site) is not scratch))
    assert events == ["class 1", ("step", True), ("class 2", True)]
    assert section.pauses == 1 and get_at(base, site) is scratch
    section.pause()  # nobody waits: a no-op
    binding.unbind()


def test_a_capture_between_steps_saves_no_session_state_and_a_plain_binding_saves_its_own(
    monkeypatch,
):
    """A plain binding's regions hold its one stream's state: capturing a new value puts
    their contents back (saved on the host). A pool lane holds nobody's state between
    steps (each step loads its session's regions and takes them back), so the
    scheduler's capture there copies none; the sessions stay exact."""
    import duplexcadence.runtime.engine.capture_state as capture_state

    saved: list[tuple] = []
    host_copy = capture_state._host_copy
    monkeypatch.setattr(
        capture_state, "_host_copy", lambda t: saved.append(tuple(t.shape)) or host_copy(t)
    )
    plain = bind_contract(
        Stream(Net(), 5, DEFAULT), decl(hold=4), device="cpu", backend="simulate", progress=False
    )
    saved.clear()
    plain.use({"p": 6})
    assert saved  # the stream's carry and scratch, put back after the capture
    plain.unbind()

    base = Stream(Net(), 7, DEFAULT)
    binding = bind_contract(base, decl(hold=4), device="cpu", backend="simulate", progress=False)
    pool = binding.sessions(lanes=2, progress=False)
    saved.clear()
    s = pool.open(_own(base, 3, 6), seed=3, params={"p": 6})
    assert pool.wait_for_captures(10.0)
    assert binding.stats()["sessions"]["background_captures"] == 1 and saved == []
    out = [s.run(s.obj.chunk, x_of(3, i)) for i in range(4)]
    assert all(torch.equal(a, b) for a, b in zip(out, solo_stock(3, 6, 4)))
    binding.unbind()
