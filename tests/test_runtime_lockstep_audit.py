"""A lockstep pool's run-time audit (runtime/serving/lockstep_audit.py): a batch-1
shadow follows sampled sessions and checks each of their rows bit for bit. It passes
the rows a proven binding serves, catches a batched step that mixes sessions (naming
the session, frame and output), and fails closed: a shadow that raises or falls behind
stops following, counted, and no session's outputs change."""

from __future__ import annotations

import threading
import time

import pytest
import torch
from test_runtime_lockstep import HeldRows, inputs, pool_of, solo

from duplexcadence.runtime.audit import first_tree_difference
from duplexcadence.runtime.serving.lockstep import LockstepPool
from duplexcadence.runtime.serving.lockstep_audit import ShadowAudit


def shadow(slow_s: float = 0.0, fail_at: int | None = None):
    """(step, reset) of the step at batch 1 on a model of its own (what a host builds
    for its pool): ``slow_s`` a call, raising at call ``fail_at``."""
    model, calls = HeldRows(1), [0]

    def step(x):
        calls[0] += 1
        if calls[0] == fail_at:
            raise RuntimeError("shadow out of memory")
        time.sleep(slow_s)
        return model.step(x)

    return step, (lambda: model.reset(torch.ones(1, dtype=torch.bool)))


def audit_of(every: int = 1, **kwargs) -> ShadowAudit:
    step, reset = shadow(**{k: kwargs.pop(k) for k in ("slow_s", "fail_at") if k in kwargs})
    return ShadowAudit(step, reset, every=every, **kwargs)


def run_sessions(pool, plan, results) -> None:
    """Sessions (seed, frames) on threads of their own, all at once."""

    def serve(seed, frames):
        with pool.open() as session:
            results[seed] = [session.step(x) for x in inputs(seed, frames)]

    threads = [threading.Thread(target=serve, args=p) for p in plan]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)


def test_the_shadow_checks_every_frame_of_a_followed_session_and_finds_a_proven_binding_exact():
    binding, pool = pool_of(gather_s=0.002, audit=audit_of())
    results: dict = {}
    run_sessions(pool, [(21, 8), (22, 8), (23, 8)], results)
    assert pool.auditor.drain()
    for seed, outs in results.items():
        assert all(torch.equal(a, b) for a, b in zip(outs, solo(seed, 8)))
    audit = pool.stats()["audit"]
    # the first session opened is followed to its end; the others opened while it was
    assert audit["followed"] == 1 and audit["skipped_busy"] == 2
    assert audit["checks"] == 8 and audit["divergences"] == 0
    assert "1 sessions followed by a batch-1 shadow, 8 frames checked, 0 diverged" in (
        pool.report()
    )
    binding.unbind()


def test_after_a_followed_session_closes_the_next_one_due_is_followed():
    _, pool = pool_of(gather_s=0.002, audit=audit_of(every=2))
    results: dict = {}
    for seed in (31, 32, 33):  # one after another: sessions 0 and 2 are due
        run_sessions(pool, [(seed, 4)], results)
    assert pool.auditor.drain()
    audit = pool.stats()["audit"]
    assert (audit["followed"], audit["checks"], audit["skipped_busy"]) == (2, 8, 0)


def test_a_batched_step_that_mixes_sessions_is_caught_naming_session_frame_and_output():
    # the unbound model: its mean over the batch axis mixes the rows of a tick
    model = HeldRows(4)
    pool = LockstepPool(
        4, model.step, reset=model.reset, hold=model.hold, gather_s=0.05, audit=audit_of()
    )
    results: dict = {}
    run_sessions(pool, [(41, 5), (42, 5)], results)
    assert pool.auditor.drain()
    audit = pool.stats()["audit"]
    assert audit["divergences"] == 1 and audit["checks"] >= 1
    (record,) = audit["divergence_records"]
    assert "session 0" in record and "output differs from its batch-1 call at index" in record
    assert audit["followed"] == 1  # followed no further once it diverged
    pool.shut_down()


def test_a_shadow_that_raises_stops_following_and_the_sessions_are_untouched(caplog):
    _, pool = pool_of(gather_s=0.002, audit=audit_of(fail_at=3))
    results: dict = {}
    run_sessions(pool, [(51, 6)], results)
    assert pool.auditor.drain()
    assert all(torch.equal(a, b) for a, b in zip(results[51], solo(51, 6)))
    audit = pool.stats()["audit"]
    assert (audit["shadow_errors"], audit["checks"], audit["divergences"]) == (1, 2, 0)
    assert audit["shadow_error_records"] == ["RuntimeError: shadow out of memory"]
    assert "the batch-1 shadow raised RuntimeError" in caplog.text


def test_a_view_that_raises_is_a_shadow_error_not_a_dead_auditor():
    step, reset = shadow()
    audit = ShadowAudit(step, reset, view=lambda out: out.no_such_output)
    _, pool = pool_of(gather_s=0.002, audit=audit)
    results: dict = {}
    run_sessions(pool, [(71, 3)], results)
    assert pool.auditor.drain(timeout_s=10)  # the shadow's thread is still there
    assert pool.stats()["audit"]["shadow_errors"] == 1
    assert all(torch.equal(a, b) for a, b in zip(results[71], solo(71, 3)))


def test_a_shadow_too_far_behind_stops_following_instead_of_holding_rows():
    _, pool = pool_of(gather_s=0.0, audit=audit_of(slow_s=0.2, max_behind=2))
    results: dict = {}
    run_sessions(pool, [(61, 8)], results)
    assert all(torch.equal(a, b) for a, b in zip(results[61], solo(61, 8)))
    assert pool.auditor.drain()
    audit = pool.stats()["audit"]
    assert audit["stopped_behind"] == 1 and audit["checks"] <= 2  # the rest dropped
    assert audit["divergences"] == 0


@pytest.mark.parametrize(
    "kwargs, error",
    [
        (dict(step=None), TypeError),
        (dict(reset=3), TypeError),
        (dict(view="rows"), TypeError),
        (dict(every=0), ValueError),
        (dict(every=1.5), ValueError),
        (dict(max_behind=-1), ValueError),
    ],
)
def test_bad_audit_arguments(kwargs, error):
    step, reset = shadow()
    with pytest.raises(error):
        ShadowAudit(**{"step": step, "reset": reset, **kwargs})


def test_a_pool_refuses_an_audit_that_is_not_a_shadow_audit():
    model = HeldRows(2)
    with pytest.raises(TypeError, match="ShadowAudit"):
        LockstepPool(2, model.step, audit=lambda x: x)


def test_first_tree_difference_names_the_leaf_and_element():
    a = {"tokens": torch.tensor([[1, 2, 3]]), "pcm": (torch.zeros(1, 4), 7)}
    assert (
        first_tree_difference(a, {"tokens": a["tokens"].clone(), "pcm": (a["pcm"][0], 7)}) is None
    )
    b = {"tokens": a["tokens"], "pcm": (torch.tensor([[0.0, -0.0, 0.0, 0.0]]), 7)}
    assert first_tree_difference(a, b) == ("output['pcm'][0]", (0, 1))  # -0.0 is other bits
    assert first_tree_difference(a, {**a, "pcm": (a["pcm"][0], 8)}) == ("output['pcm'][1]", None)
    assert first_tree_difference(a, {"tokens": a["tokens"]}) == ("output", None)
    assert first_tree_difference(torch.zeros(2), torch.zeros(3)) == ("output", None)
