"""The lane scheduler on its own (runtime/serving/lane_scheduler.py): lanes are plain names,
what each holds a dict, a capture a function that records its calls. The session pool
tests (test_runtime_params.py) run it with real lanes and bit-exact outputs."""

import threading
import time

import pytest

from duplexcadence.runtime.serving.lane_scheduler import LaneScheduler, NoLaneAvailable


class Lanes:
    """Lanes "a", "b", "c" holding the values in ``holding``; captures recorded (and
    optionally held up until ``release_capture`` is set)."""

    def __init__(self, holding: dict[str, set], *, block_captures: bool = False) -> None:
        self.holding = {lane: set(values) for lane, values in holding.items()}
        self.captured: list[tuple[str, str]] = []
        self.release_capture = threading.Event()
        if not block_captures:
            self.release_capture.set()

    def held(self, lane: str) -> frozenset:
        return frozenset(self.holding[lane])

    def capture(self, lane: str, key: str) -> None:
        self.release_capture.wait(10)
        self.captured.append((lane, key))
        self.holding[lane].add(key)


def scheduler(lanes: Lanes, *, captures: bool = True, **kwargs) -> LaneScheduler:
    kwargs.setdefault("timeout_s", 5.0)
    capture = lanes.capture if captures else None
    return LaneScheduler(list(lanes.holding), held=lanes.held, capture=capture, **kwargs)


def test_a_step_waits_briefly_for_the_busy_lane_holding_its_value():
    lanes = Lanes({"a": {"v"}, "b": {"w"}})
    s = scheduler(lanes, captures=False, affinity_patience_s=2.0)
    s.opened("v")
    s.opened("w")
    first, hit = s.acquire("v")
    assert (first, hit) == ("a", True)
    threading.Timer(0.2, s.release, args=("a",)).start()
    t0 = time.perf_counter()
    lane, hit = s.acquire("v")  # "b" is free but holds "w" only: worth waiting for "a"
    assert (lane, hit) == ("a", True) and 0.15 < time.perf_counter() - t0 < 1.5
    assert s.stats()["eager_steps"] == 0
    s.stop()


def test_past_its_patience_a_step_runs_eager_on_any_free_lane():
    lanes = Lanes({"a": {"v"}, "b": {"w"}})
    s = scheduler(lanes, captures=False, affinity_patience_s=0.1)
    s.opened("v")
    s.opened("w")
    s.acquire("v")  # "a" busy from here on
    t0 = time.perf_counter()
    lane, hit = s.acquire("v")
    assert (lane, hit) == ("b", False) and time.perf_counter() - t0 >= 0.1
    st = s.stats()
    assert st["eager_steps"] == 1 and st["affinity_misses"] == 1 and st["affinity_hits"] == 1
    s.stop()


def test_later_steps_pass_a_step_waiting_for_its_lane():
    lanes = Lanes({"a": {"v"}, "b": {"w"}})
    s = scheduler(lanes, affinity_patience_s=5.0)
    s.opened("v")
    s.opened("w")
    s.acquire("v")  # "a" busy
    got: dict = {}
    waiting = threading.Thread(target=lambda: got.setdefault("v", s.acquire("v")))
    waiting.start()
    time.sleep(0.1)
    assert s.acquire("w") == ("b", True)  # not queued behind the step waiting for "a"
    s.release("a")
    waiting.join(5)
    assert got["v"] == ("a", True)
    s.stop()


def test_a_value_is_captured_when_its_first_session_opens_on_the_least_loaded_lane():
    lanes = Lanes({"a": {"v"}, "b": set(), "c": {"w"}})
    s = scheduler(lanes)
    for key in ("v", "v", "w"):  # held already: nothing to capture at open
        s.opened(key)
    assert s.idle(5) and lanes.captured == []
    s.opened("x")  # new: captured now, on "b", the lane that serves nobody
    assert s.idle(5) and lanes.captured == [("b", "x")]
    assert s.acquire("x") == ("b", True)
    s.stop()


def test_more_lanes_for_a_value_only_when_its_steps_find_its_lane_busy():
    lanes = Lanes({"a": {"v"}, "b": set()})
    s = scheduler(lanes, affinity_patience_s=0.0)
    s.opened("v")  # the only value: its share is both lanes, but one holds it already
    s.opened("v")
    assert s.idle(5) and lanes.captured == []
    s.acquire("v")  # "a"
    lane, hit = s.acquire("v")  # "a" busy: eager on "b", and "v" wanted there
    assert (lane, hit) == ("b", False)
    s.release("b")
    assert s.idle(5) and lanes.captured == [("b", "v")]
    s.stop()


def test_a_value_of_one_session_among_many_is_captured_on_one_lane():
    lanes = Lanes({"a": set(), "b": set(), "c": set()}, block_captures=True)
    s = scheduler(lanes)
    for key in ("p", "q", "r", "t"):
        s.opened(key)
    lanes.release_capture.set()
    assert s.idle(5)
    assert sorted(k for _, k in lanes.captured) == ["p", "q", "r", "t"]
    assert {lane for lane, _ in lanes.captured} == {"a", "b", "c"}  # spread by load
    s.stop()


def test_steps_never_wait_for_a_capture():
    lanes = Lanes({"a": set(), "b": set()}, block_captures=True)
    s = scheduler(lanes, patience_s=0.0)
    s.opened("v")
    time.sleep(0.1)  # the capture thread holds one lane, blocked in its capture
    t0 = time.perf_counter()
    lane, hit = s.acquire("v")  # no lane holds "v" yet: eager on the other one, now
    assert not hit and time.perf_counter() - t0 < 0.5
    s.release(lane)
    lanes.release_capture.set()
    assert s.idle(5) and s.acquire("v")[1]
    s.stop()


def test_an_overloaded_pool_refuses_after_its_timeout():
    lanes = Lanes({"a": set()})
    s = scheduler(lanes, timeout_s=0.2)
    s.acquire("v")
    with pytest.raises(NoLaneAvailable, match="within 0.2 s"):
        s.acquire("v")
    s.stop()


def test_under_load_a_capture_past_its_patience_gets_the_next_lane_released():
    """Steps always waiting, one lane each time: the capture still gets a lane once it
    has waited ``patience_s``, before the waiting steps."""
    lanes = Lanes({"a": {"w"}, "b": {"w"}})
    s = scheduler(lanes, patience_s=0.1, affinity_patience_s=0.0)
    s.opened("w")
    s.opened("w")
    s.opened("w")
    held = [s.acquire("w")[0], s.acquire("w")[0]]  # both lanes busy
    s.opened("v")  # wants a lane; none free
    got: list = []
    waiting = threading.Thread(target=lambda: got.append(s.acquire("w")))
    waiting.start()
    time.sleep(0.2)  # the capture is due now
    s.release(held[0])  # the step waiting must not take it
    assert s.idle(5) and lanes.captured == [(held[0], "v")]
    waiting.join(5)
    assert got and got[0][0] == held[0]  # it ran after the capture, on the lane back
    s.stop()
