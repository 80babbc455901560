"""The eager section's lock (runtime/serving/eager_lock.py): arrival order, reentrancy, and
the hand-over a background capture makes between two classes."""

import threading
import time

import pytest

from duplexcadence.runtime.serving.eager_lock import EagerLock


def _queue_up(lock: EagerLock, name: str, order: list, hold_s: float = 0.0) -> threading.Thread:
    def run() -> None:
        with lock:
            order.append(name)
            time.sleep(hold_s)

    t = threading.Thread(target=run)
    n = lock.waiting()
    t.start()
    while lock.waiting() == n:  # queued before the next one starts
        time.sleep(0.001)
    return t


def test_waiters_get_the_lock_in_arrival_order():
    lock, order = EagerLock(), []
    with lock:
        threads = [_queue_up(lock, name, order) for name in "abcde"]
    for t in threads:
        t.join(5)
    assert order == list("abcde")


def test_reentrant_and_release_checked():
    lock = EagerLock()
    with lock:
        with lock:
            assert lock.held_here()
        assert lock.held_here()
    assert not lock.held_here()
    with pytest.raises(RuntimeError, match="does not hold"):
        lock.release()


def test_hand_over_runs_one_waiter_then_the_holder_before_the_rest():
    lock, order = EagerLock(), []
    with lock:
        assert lock.hand_over() is False  # nobody waits: nothing to hand over
        threads = [_queue_up(lock, name, order, 0.01) for name in "ab"]
        assert lock.hand_over() is True
        order.append("capture")
        assert lock.hand_over() is True
        order.append("capture again")
    for t in threads:
        t.join(5)
    assert order == ["a", "capture", "b", "capture again"]


def test_hand_over_needs_a_single_hold():
    lock = EagerLock()
    with pytest.raises(RuntimeError, match="held once"):
        lock.hand_over()
    with lock, lock:
        with pytest.raises(RuntimeError, match="held once"):
            lock.hand_over()
