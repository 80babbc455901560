"""runtime/serve/journal.py: a session's calls kept to rebuild it elsewhere (no Ray)."""

from __future__ import annotations

import numpy as np
import pytest

from duplexcadence.runtime.serve.journal import Journal, RestoreDiverged, output_digest


class Replica:
    """A stand-in session: its output is the running sum of its payloads since the
    last reset, so any lost, repeated or reordered call changes the bytes."""

    def __init__(self, skew: float = 0.0) -> None:
        self.total = np.zeros(3, dtype=np.float32)
        self.skew = skew
        self.seen: list = []

    def __call__(self, method: str, *args):
        self.seen.append((method, *(a.copy() for a in args)))
        if method == "reset":
            self.total = np.zeros(3, dtype=np.float32)
            return None
        self.total = self.total + args[0] + self.skew
        return self.total.copy()


def replay(journal: Journal, replica: Replica) -> None:
    """As the ingress replays a journal on a fresh session (app.py, ``_replay``)."""
    for method, args, check in journal.replaying():
        check(replica(method, *args))


def run(journal: Journal, replica: Replica, calls: list) -> list:
    outs = []
    for method, *args in calls:
        frozen = Journal.freeze(args[0]) if args else None
        out = replica(method, *args)
        journal.record(method, frozen, out)
        outs.append(out)
    return outs


CALLS = [
    ("step", np.ones(3, np.float32)),
    ("step", np.full(3, 2, np.float32)),
    ("reset",),
    ("step", np.arange(3, dtype=np.float32)),
]


def test_a_replay_makes_the_same_calls_in_order_and_checks_every_output():
    journal = Journal({"seed": 1}, limit=10)
    first = Replica()
    run(journal, first, CALLS)
    second = Replica()
    replay(journal, second)
    assert [c[0] for c in second.seen] == ["step", "step", "reset", "step"]
    assert all(np.array_equal(a[1], b[1]) for a, b in zip(first.seen, second.seen) if len(a) > 1)
    assert np.array_equal(second.total, first.total)


def test_a_payload_changed_after_its_call_is_replayed_as_it_was_sent():
    journal = Journal({}, limit=10)
    buf = np.ones(3, np.float32)
    run(journal, Replica(), [("step", buf)])
    buf[:] = 7  # the caller reuses its buffer
    again = Replica()
    replay(journal, again)
    assert np.array_equal(again.seen[0][1], np.ones(3, np.float32))


def test_a_replay_that_answers_other_bytes_fails_at_that_call():
    journal = Journal({}, limit=10)
    run(journal, Replica(), CALLS)
    with pytest.raises(RestoreDiverged, match="call 1 of 4 answered other bytes"):
        replay(journal, Replica(skew=1e-7))


def test_a_history_longer_than_the_limit_is_dropped_and_says_so():
    journal = Journal({}, limit=3)
    run(journal, Replica(), CALLS[:3])
    assert journal.why_not() is None and journal.nbytes > 0
    run(journal, Replica(), CALLS[3:] + CALLS[:1])
    assert journal.calls == [] and journal.nbytes == 0
    assert journal.why_not() == "it had made 5 calls, more than the 3 a restore replays"


def test_output_digest_tells_dtype_shape_and_bytes_apart():
    z = np.zeros(4, np.float32)
    digests = {
        output_digest(z),
        output_digest(z.reshape(2, 2)),
        output_digest(np.zeros(4, np.int32)),
        output_digest(np.array([0, 0, 0, -0.0], np.float32)),  # -0.0 == 0.0, other bytes
        output_digest({"pcm": [0.0] * 4}),
    }
    assert len(digests) == 5
    strided = np.arange(8, dtype=np.float32)[::2]
    assert output_digest(strided) == output_digest(strided.copy())
