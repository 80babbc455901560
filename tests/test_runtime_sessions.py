"""Sessions on one binding (runtime/serving/sessions.py) on the CPU with the fake graph backend.

A synthetic streaming step with the shapes of the real ones: a per-session carry
(head ++ tail retention, trimmed by the stock driver after the call, aliased by the
callable), a write-through scratch buffer at a site of the shared module, and shared
weights. Every session's outputs must equal the same session run alone on the
unbound stock code, whatever the interleaving, the lane or the number of threads.
(tests/test_runtime_cuda.py repeats the concurrency test with real graphs and RNG.)
"""

from __future__ import annotations

import copy
import random
import threading

import pytest
import torch

from toy_stream import Net, Stream, decl, solo_stock, x_of

from duplexcadence.runtime import (
    FakeGraphBackend,
    LaneError,
    NoLaneAvailable,
    SessionBusy,
    SessionError,
    SessionRequired,
    bind_contract,
)

DECL = decl()


@pytest.fixture
def served():
    """(base object, binding): the binding is made on one Stream; sessions get copies."""
    base = Stream(Net(), seed=99)
    binding = bind_contract(base, DECL, device="cpu", backend=FakeGraphBackend(), progress=False)
    binding.capture(progress=False)
    yield base, binding
    binding.unbind()


def open_session(pool, base, seed, **kw):
    obj = copy.copy(base)
    obj.prompt = Stream(base.net, seed).prompt
    obj.prime()
    return pool.open(obj, seed=seed, **kw)


@pytest.mark.parametrize("lanes", [1, 3])
def test_interleaved_sessions_equal_their_solo_stock_runs(served, lanes):
    base, binding = served
    pool = binding.sessions(lanes=lanes, progress=False)
    seeds = [1, 2, 3, 4, 5]
    sessions = {s: open_session(pool, base, s) for s in seeds}
    got = {s: [] for s in seeds}
    order = [s for i in range(7) for s in seeds]
    random.Random(0).shuffle(order)
    counts = dict.fromkeys(seeds, 0)
    for s in order:
        i = counts[s]
        counts[s] += 1
        sess = sessions[s]
        got[s].append(sess.run(sess.obj.chunk, x_of(s, i)))
    for s in seeds:
        want = solo_stock(s, counts[s])
        assert all(torch.equal(a, b) for a, b in zip(got[s], want)), f"session {s} differs"
    st = binding.stats()
    assert st["lanes"] == lanes and st["sessions"]["runs"] == len(order)
    assert st["callables"]["step"]["hits"] > 0
    # the session keeps its own copy of the carry, never a view of lane memory
    lane_ptrs = {lane.regions["carry"].storage_ptr() for lane in binding.lanes}
    for sess in sessions.values():
        assert sess.obj.state["cache"].untyped_storage().data_ptr() not in lane_ptrs


def test_many_threads_many_lanes_every_session_exact(served):
    base, binding = served
    pool = binding.sessions(lanes=3, progress=False)
    seeds = list(range(10, 18))
    results: dict[int, list] = {}
    errors: list[BaseException] = []

    def client(seed: int) -> None:
        try:
            sess = open_session(pool, base, seed)
            results[seed] = [sess.run(sess.obj.chunk, x_of(seed, i)) for i in range(6)]
            sess.close()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=client, args=(s,)) for s in seeds]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors and not any(t.is_alive() for t in threads)
    for s in seeds:
        assert all(torch.equal(a, b) for a, b in zip(results[s], solo_stock(s, 6)))
    st = pool.stats()
    assert st["open"] == 0 and st["closed"] == len(seeds) and st["session_bytes"] == 0


def test_turn_reset_restores_the_primed_state_and_is_shared_by_key(served):
    base, binding = served
    pool = binding.sessions(lanes=2, progress=False)
    a = open_session(pool, base, 7, turn_key="voice-7")
    a.mark_turn_start()
    got = [a.run(a.obj.chunk, x_of(7, i)) for i in range(5)]
    a.reset()  # a new turn: the stock client re-primes here
    got += [a.run(a.obj.chunk, x_of(7, i)) for i in range(5, 9)]
    want = solo_stock(7, 9, reset_at=(5,))
    assert all(torch.equal(x, y) for x, y in zip(got, want))
    # a second session of the same voice starts from the kept state, without priming
    b = pool.open(copy.copy(base), seed=7, turn_key="voice-7")
    b.obj.state = None  # nothing primed: the kept turn start is all it has
    got_b = [b.run(b.obj.chunk, x_of(7, i)) for i in range(4)]
    assert all(torch.equal(x, y) for x, y in zip(got_b, solo_stock(7, 4)))
    assert pool.stats()["turn_starts"] == 1


def test_misuse_fails_with_clear_errors(served):
    base, binding = served
    pool = binding.sessions(lanes=1, progress=False, timeout_s=0.2)
    s = open_session(pool, base, 1)
    with pytest.raises(SessionRequired, match="inside session.run"):
        base.chunk(x_of(1, 0))  # the model's code outside every session
    with pytest.raises(TypeError, match="callable"):
        s.run(42)
    # a session's steps are sequential; a full pool answers with a timeout, not a hang
    entered, release = threading.Event(), threading.Event()

    def hold():
        entered.set()
        release.wait(5)

    t = threading.Thread(target=s.run, args=(hold,))
    t.start()
    entered.wait(5)
    with pytest.raises(SessionBusy):
        s.run(lambda: None)
    other = open_session(pool, base, 2)
    with pytest.raises(NoLaneAvailable, match="no lane of 1"):
        other.run(lambda: None)
    release.set()
    t.join(5)
    s.close()
    s.close()  # idempotent
    with pytest.raises(SessionError, match="closed"):
        s.run(lambda: None)
    with pytest.raises(SessionError, match="no turn start"):
        other.reset()
    with pytest.raises(ValueError, match="lanes"):
        binding.sessions(lanes=0)
    with pytest.raises(RuntimeError, match="already serves"):
        binding.sessions(lanes=1)
    with pytest.raises(ValueError, match="public attribute"):
        pool.open(copy.copy(base), state=("__class__",))


def test_close_during_a_step_waits_for_it_and_loses_nothing(served):
    """A client that hangs up while its chunk runs (the WebSocket closes, the ingress
    closes the session from another thread): the step finishes with its right answer,
    then the state is released; closing from inside the step is refused, not a hang."""
    base, binding = served
    pool = binding.sessions(lanes=2, progress=False)
    s = open_session(pool, base, 4)
    first = s.run(s.obj.chunk, x_of(4, 0))
    entered, release = threading.Event(), threading.Event()
    out: list = []

    def slow_chunk(x):
        entered.set()
        release.wait(5)
        return s.obj.chunk(x)

    t = threading.Thread(target=lambda: out.append(s.run(slow_chunk, x_of(4, 1))))
    t.start()
    entered.wait(5)
    closer = threading.Thread(target=s.close)
    closer.start()
    closer.join(0.2)
    assert closer.is_alive() and not s.closed  # it waits for the step in flight
    release.set()
    t.join(5)
    closer.join(5)
    assert not closer.is_alive() and s.closed
    assert all(torch.equal(a, b) for a, b in zip([first, *out], solo_stock(4, 2)))
    assert s.storage == {} and pool.stats()["open"] == 0 and s.nbytes() == 0
    with pytest.raises(SessionError, match="closed"):
        s.run(s.obj.chunk, x_of(4, 2))
    inner = open_session(pool, base, 5)
    with pytest.raises(SessionError, match="inside its own step"):
        inner.run(inner.close)
    inner.close()
    assert pool.stats()["open"] == 0


def test_plain_binding_serves_threads_one_at_a_time():
    """Without sessions a binding is one stream: callers are serialised (no crash, no
    hang) and a single stream stays exact."""
    base = Stream(Net(), seed=3)
    binding = bind_contract(base, DECL, device="cpu", backend=FakeGraphBackend(), progress=False)
    binding.capture(progress=False)
    got = [base.chunk(x_of(3, i)) for i in range(6)]
    assert all(torch.equal(a, b) for a, b in zip(got, solo_stock(3, 6)))
    outs: list = []
    threads = [
        threading.Thread(target=lambda: outs.append(binding.lanes[0].regions["carry"].length))
        for _ in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(5)
    assert len(outs) == 4
    binding.unbind()


def test_a_second_lane_refuses_model_state_the_contract_does_not_declare():
    """The step writes a model buffer the contract leaves out: with one lane that is
    stock behaviour; every further lane's graphs would share it, so the pool refuses."""
    base = Stream(Net(), seed=5)
    binding = bind_contract(
        base, decl(declare_conv=False), device="cpu", backend=FakeGraphBackend(), progress=False
    )
    binding.capture(progress=False)
    with pytest.raises(LaneError, match="net.conv_buf"):
        binding.sessions(lanes=2, progress=False)
