"""The lockstep pool of a batched binding (runtime/serving/lockstep.py): sessions on
slots, each calling from its own thread, served in ticks of one batched call. Each
session's outputs equal its solo stock run whatever joins when, whoever sits ticks out
and however the threads interleave; bad input, a full pool, a closed session and a
failing tick are clear errors."""

from __future__ import annotations

import importlib
import threading
import time

import pytest
import torch

from duplexcadence.compiler.driver import compile_source
from duplexcadence.runtime.serving.lockstep import LockstepPool, PoolFull
from fuzzing import import_package

CONTRACT = """
contract held_rows
clock frame = 1 per call
region acc {
  dtype float32
  dims [1, 4]
  lifetime session
  site acc
  slot 0
}
callable step {
  site step
  per frame
  arg x: float32 [1, 4]
  writes acc
  batch widths {4} rows {aten.mean.dim}
}
"""


class HeldRows(torch.nn.Module):
    """``width`` sessions of a step with a per-session accumulator, built as a vendor
    builds a batched streaming model: ``run`` (its exec mask) says which rows advance,
    a row off keeps its state; ``reset(mask)`` zeroes the rows in the mask."""

    def __init__(self, width: int) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.w = torch.nn.Parameter(torch.randn(4, 4), requires_grad=False)
        self.acc = torch.zeros(width, 4)
        self.run = torch.ones(width, dtype=torch.bool)

    def step(self, x: torch.Tensor) -> torch.Tensor:
        # the mean over axis 0 is a session's own row at batch 1 and mixes sessions
        # batched unless it runs per row
        y = (x * x.mean(dim=0, keepdim=True)) @ self.w + 1.0  # a parked zero row moves acc
        self.acc.copy_(torch.where(self.run[:, None], self.acc + y, self.acc))
        return y + self.acc

    def hold(self, mask: torch.Tensor) -> None:
        self.run.copy_(mask)

    def reset(self, mask: torch.Tensor) -> None:
        self.acc.copy_(torch.where(mask[:, None], torch.zeros_like(self.acc), self.acc))
        self.run.copy_(self.run | mask)


def adapter():
    result = compile_source(CONTRACT, "held_rows.clock")
    assert result.ok, result.diagnostics
    name, _ = import_package(result.files)
    return importlib.import_module(f"{name}.adapter")


def inputs(seed: int, frames: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(1, 4, generator=g) for _ in range(frames)]


def solo(seed: int, frames: int) -> list[torch.Tensor]:
    model = HeldRows(1)
    return [model.step(x).clone() for x in inputs(seed, frames)]


def pool_of(width: int = 4, hold: bool = True, **kwargs):
    model = HeldRows(width)
    binding = adapter().bind(model, device="cpu", backend="simulate", batch=width, progress=False)
    pool = binding.lockstep(
        model.step, reset=model.reset, hold=model.hold if hold else None, **kwargs
    )
    return binding, pool


def serve(pool, seed: int, frames: int, pause_at: int | None, results: dict, start=None):
    if start is not None:
        start.wait()
    with pool.open() as session:
        outs = []
        for f, x in enumerate(inputs(seed, frames)):
            if f == pause_at:
                time.sleep(0.15)  # sits some ticks out
            outs.append(session.step(x))
        results[seed] = (session.slot, outs)


@pytest.mark.parametrize("hold", [True, False])
def test_each_session_gets_its_solo_bytes_whatever_joins_when(hold):
    binding, pool = pool_of(hold=hold, gather_s=0.002)
    results: dict = {}
    late = threading.Event()
    plan = [(11, 12, None, None), (12, 12, 3, None), (13, 9, None, late), (14, 6, None, None)]
    threads = [
        threading.Thread(target=serve, args=(pool, seed, frames, pause, results, start))
        for seed, frames, pause, start in plan
    ]
    for t in threads[:2]:
        t.start()
    time.sleep(0.05)
    late.set()  # session 13 opens after the first two have run some ticks
    for t in threads[2:]:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert set(results) == {11, 12, 13, 14}
    for seed, frames, _, _ in plan:
        slot, outs = results[seed]
        want = solo(seed, frames)
        for f, (got, ref) in enumerate(zip(outs, want)):
            assert torch.equal(got, ref), (seed, slot, f)
    s = pool.stats()
    assert s["rows"] == sum(frames for _, frames, _, _ in plan) and s["opened"] == 4
    if hold:  # the pausing session sat ticks out while the others went on
        assert s["parked"] > 0
    step = binding.stats()["callables"]["step"]
    assert step["hits"] == s["ticks"] and step["misses"] == {}, step
    assert "lockstep pool: 4 slots" in binding.report()
    assert binding.stats()["lockstep"]["ticks"] == s["ticks"]
    binding.unbind()


def test_a_clocked_pool_serves_sessions_of_every_phase_in_one_tick_a_period():
    # frames arrive at each session's own phase of a 60 ms period; a tick started on
    # the first frame in would make three ticks a period, the clock makes about one
    binding, pool = pool_of(period_s=0.06)
    frames, phases, results = 8, (0.0, 0.02, 0.04), {}
    start = time.perf_counter() + 0.05

    def client(seed: int, phase: float) -> None:
        with pool.open() as session:
            outs = []
            for k, x in enumerate(inputs(seed, frames)):
                time.sleep(max(0.0, start + phase + 0.06 * k - time.perf_counter()))
                outs.append(session.step(x))
            results[seed] = outs

    threads = [threading.Thread(target=client, args=(21 + i, ph)) for i, ph in enumerate(phases)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    for seed, outs in results.items():
        assert all(torch.equal(g, w) for g, w in zip(outs, solo(seed, frames))), seed
    assert len(results) == 3
    assert pool.stats()["ticks"] <= frames + 3, pool.stats()  # not 3 a period
    binding.unbind()


def test_without_hold_a_tick_waits_for_every_open_session():
    _, pool = pool_of(hold=False, gather_s=0.0)
    a, b = pool.open(), pool.open()
    out: dict = {}
    t = threading.Thread(target=lambda: out.setdefault("a", a.step(inputs(1, 1)[0])))
    t.start()
    time.sleep(0.1)
    assert "a" not in out  # a parked row would advance b's state: the tick waits for b
    b.step(inputs(2, 1)[0])
    t.join(timeout=10)
    assert torch.equal(out["a"], solo(1, 1)[0])
    assert pool.stats()["ticks"] == 1


def test_frames_handed_in_ahead_are_served_in_order_one_a_tick_and_exact():
    # two sessions hand in all their frames at once (a stream that fell behind): each
    # tick serves the head of every session's queue, so 5 frames take 5 ticks, every
    # frame its solo bytes in order, and a tick ends no later than the frame's result
    binding, pool = pool_of(width=4, hold=False)
    a, b = pool.open(), pool.open()
    frames_a = [a.submit(x) for x in inputs(31, 5)]
    frames_b = [b.submit(x) for x in inputs(32, 5)]
    for got, want in zip([f.result() for f in frames_b], solo(32, 5)):
        assert torch.equal(got, want)
    for got, want in zip([f.result() for f in frames_a], solo(31, 5)):
        assert torch.equal(got, want)
    assert pool.stats()["ticks"] == 5 and pool.stats()["rows"] == 10
    assert all(f.done_at >= f.submitted_at for f in frames_a + frames_b)
    binding.unbind()


def test_a_session_ahead_by_max_ahead_waits_and_a_closed_one_loses_its_queue_loudly():
    # without hold a tick waits for every open session: b never hands in, so a's frames
    # queue; at max_ahead a's next submit waits and then says why; closing a fails the
    # frames it queued (never served) instead of dropping them silently
    binding, pool = pool_of(width=4, hold=False, max_ahead=2, timeout_s=0.3)
    a, _b = pool.open(), pool.open()
    queued = [a.submit(x) for x in inputs(33, 2)]
    with pytest.raises(TimeoutError, match="2 frames unserved"):
        a.submit(inputs(33, 3)[2])
    a.close()
    for frame in queued:
        with pytest.raises(RuntimeError, match="slot 0 closed"):
            frame.result()
    with pytest.raises(ValueError, match="max_ahead"):
        LockstepPool(2, lambda x: x, max_ahead=0)
    binding.unbind()


def test_a_session_behind_gets_ticks_before_the_beat_until_it_caught_up():
    # a clocked pool (1 s period) with hold: b is on time (no frame yet), a has three
    # frames queued (it fell behind); a's queue runs ticks back to back, not one a beat
    binding, pool = pool_of(period_s=1.0)
    a, _b = pool.open(), pool.open()
    t = time.perf_counter()
    frames = [a.submit(x) for x in inputs(34, 3)]
    for got, want in zip([f.result() for f in frames[:2]], solo(34, 2)):
        assert torch.equal(got, want)
    assert time.perf_counter() - t < 0.9  # two frames served before the first beat
    assert torch.equal(frames[2].result(), solo(34, 3)[2])  # the last one: at the beat
    binding.unbind()


def test_sessions_opened_between_two_ticks_are_reset_in_one_call():
    # a ramp: three sessions open before any tick; the first tick resets the three
    # slots with one call of the model's reset, and each session still gets its solo bytes
    binding, pool = pool_of(width=4, hold=False)
    masks: list = []
    reset = pool._reset
    pool._reset = lambda mask: (masks.append(mask.tolist()), reset(mask))
    sessions = [pool.open() for _ in range(3)]
    frames = [s.submit(inputs(40 + i, 1)[0]) for i, s in enumerate(sessions)]
    for i, f in enumerate(frames):
        assert torch.equal(f.result(), solo(40 + i, 1)[0])
    assert masks == [[True, True, True, False]] and pool.stats()["resets"] == 1
    binding.unbind()


def test_a_reset_that_fails_fails_its_tick_and_is_tried_again_not_skipped():
    # slot 0 holds an earlier session's state; the model's reset for the next session on
    # it raises once: that tick fails loudly, and the next resets the slot before serving
    # it (served on the stale state, the session's bytes would differ from its solo run)
    binding, pool = pool_of(width=4, hold=False)
    reset, failures = pool._reset, []

    def flaky(mask):
        if failures:
            raise failures.pop()
        reset(mask)

    pool._reset = flaky
    with pool.open() as earlier:
        earlier.step(inputs(40, 1)[0])
    failures.append(RuntimeError("reset failed"))
    a = pool.open()
    assert a.slot == 0
    x = inputs(41, 1)[0]
    with pytest.raises(RuntimeError, match="reset failed"):
        a.step(x)
    assert torch.equal(a.step(x), solo(41, 1)[0])
    assert pool.stats()["resets"] == 2
    binding.unbind()


def test_a_pool_counts_where_a_tick_cycle_goes_and_keeps_a_timeline():
    # one session alone: each tick has every open session in; a second session opened
    # but silent makes the next ticks partial (the clock starts them), each held
    _, pool = pool_of(period_s=0.03)
    a = pool.open()
    for x in inputs(3, 2):
        a.step(x)
    pool.open()
    a.step(inputs(3, 3)[2])
    s = pool.stats()
    assert (s["ticks"], s["partial_ticks"], s["opened"], s["resets"]) == (3, 1, 2, 2)
    assert s["holds"] >= 1 and s["reset_s"] > 0 and s["max_tick_s"] > 0
    assert [r[3] for r in pool.timeline] == [1, 1, 1] and [r[4] for r in pool.timeline] == [
        False,
        False,
        True,
    ]
    assert pool.timeline[0][2] == 0.0 and pool.timeline[2][2] > 0  # gap: after the first
    assert s["gap_s"] == pytest.approx(sum(r[2] for r in pool.timeline) / 1e3, abs=1e-3)
    pool.shut_down()


def test_bad_input_a_full_pool_and_a_closed_session_are_clear_errors():
    _, pool = pool_of(width=4)
    sessions = [pool.open() for _ in range(4)]
    with pytest.raises(PoolFull, match="all 4 slots"):
        pool.open()
    with pytest.raises(ValueError, match="leading extent 1"):
        sessions[0].step(torch.zeros(2, 4))
    with pytest.raises(ValueError, match="leading extent 1"):
        sessions[0].step("frame")
    sessions[1].close()
    with pytest.raises(RuntimeError, match="closed"):
        sessions[1].step(torch.zeros(1, 4))
    assert pool.open().slot == 1  # the freed slot
    done = [threading.Thread(target=s.step, args=(torch.zeros(1, 4),)) for s in sessions[2:]]
    for t in done:
        t.start()
    sessions[0].step(torch.zeros(1, 4))
    with pytest.raises(ValueError, match=r"differs from the pool's rows \(1, 4\)"):
        sessions[0].step(torch.zeros(1, 5))


def test_a_failing_tick_raises_in_every_session_it_served():
    def broken(x: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("kernel fault")

    pool = LockstepPool(2, broken)
    a, b = pool.open(), pool.open()
    errors: list = []

    def call(s):
        try:
            s.step(torch.zeros(1, 3))
        except RuntimeError as e:
            errors.append(str(e))

    threads = [threading.Thread(target=call, args=(s,)) for s in (a, b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert errors == ["lockstep tick failed: kernel fault"] * 2
    pool.shut_down()
    with pytest.raises(RuntimeError, match="shut down"):
        pool.open()


@pytest.mark.parametrize(
    "kwargs, error",
    [
        ({"width": 0}, ValueError),
        ({"width": 2.0}, ValueError),
        ({"step": None}, TypeError),
        ({"hold": 3}, TypeError),
        ({"gather_s": -1}, ValueError),
        ({"period_s": 0}, ValueError),
        ({"period_s": "80ms"}, ValueError),
    ],
)
def test_bad_pool_arguments(kwargs, error):
    args = {"width": 2, "step": lambda x: x, **kwargs}
    with pytest.raises(error):
        LockstepPool(args.pop("width"), args.pop("step"), **args)


def test_on_a_clock_a_session_opened_between_ticks_is_reset_before_the_beat_not_in_the_tick():
    # Moshi's reset took 13 ms of each ramp tick: on a clock the ticker resets the slots
    # opened since the last tick while it waits for the beat, and the tick only steps
    binding, pool = pool_of(period_s=0.05)
    a = pool.open()
    for x in inputs(50, 2):
        a.step(x)
    ticks = pool.stats()["ticks"]
    b = pool.open()
    deadline = time.perf_counter() + 2.0
    while pool.stats()["resets"] < 2 and time.perf_counter() < deadline:
        time.sleep(0.005)
    assert pool.stats()["resets"] == 2 and pool.stats()["ticks"] == ticks  # no tick ran it
    outs = [b.step(x) for x in inputs(51, 3)]
    assert all(torch.equal(o, want) for o, want in zip(outs, solo(51, 3)))
    assert pool.stats()["resets"] == 2  # the tick that served b did not reset again
    binding.unbind()


def test_an_idle_pool_on_a_clock_sleeps_until_a_frame_or_an_open_comes():
    # after its sessions went quiet a clocked pool's beat lies in the past: the ticker
    # must wait for a submission, not look again and again (it spun at 100 % of a core)
    binding, pool = pool_of(period_s=0.02)
    a, _silent = pool.open(), pool.open()  # b never hands in: a's ticks run on the clock
    a.step(inputs(60, 1)[0])
    a.step(inputs(60, 2)[1])
    assert pool._beat is not None
    time.sleep(0.1)  # past the beat, nothing queued
    looks = 0
    wait_s = pool._wait_s

    def counted():
        nonlocal looks
        looks += 1
        return wait_s()

    pool._wait_s = counted
    time.sleep(0.3)
    assert looks <= 2, f"the idle ticker looked {looks} times in 0.3 s"
    assert torch.equal(a.step(inputs(60, 3)[2]), solo(60, 3)[2])  # and still serves
    binding.unbind()
