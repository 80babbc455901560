"""AS2D's loops over transformers 4.57.6 Whisper (bench/workloads/whisper_as2d.py) at the
tiny shapes, on the CPU: serial and decoupled speculative decoding commit the target's
greedy tokens (tier 2), a graphed run (simulate backend, both contracts bound) equals its
eager replay on the recorded round schedule byte for byte (tier 1), and the vendor's own
assisted generate() decodes the same tokens."""

import pytest
import torch

from bench.workloads import transformers_whisper as W

pytestmark = pytest.mark.skipif(
    W.unavailable_reason() is not None, reason=str(W.unavailable_reason())
)

N = 40  # tokens a request commits
SEED = 11  # the request


def models():
    return W.build_whisper("tiny", seed=0), W.build_whisper("draft-tiny", seed=1)


def bound(state, shape):
    return W.bind_adapter(state, "cpu", backend="simulate", shape=shape)


def test_speculative_loops_commit_the_target_s_greedy_tokens():
    from bench.workloads import whisper_as2d as A

    target, drafter = (W.new_state(m) for m in models())
    greedy = A.Arm("alone", target).run(SEED, N).tokens
    assert greedy == A.trajectory(target, SEED, N)
    for loop in ("serial", "decoupled"):
        random = A.Arm(loop, target, drafter, "drafter").run(SEED, N)
        oracle = A.Arm(loop, target, drafter, "oracle", 0.22).run(SEED, N, oracle=greedy)
        exact = A.Arm(loop, target, drafter, "oracle", 0.0).run(SEED, N, oracle=greedy)
        for t in (random, oracle, exact):
            assert t.tokens == greedy, loop
            assert sum(t.accepted) + len(t.widths) == N - 1  # one committed beyond each
        # the random drafter almost never agrees; the oracle's acceptance is the run's
        assert sum(random.accepted) <= 2, random.accepted
        assert 1.5 < sum(oracle.accepted) / len(oracle.accepted) < 6, oracle.accepted
        assert len(exact.widths) < len(oracle.widths) < len(random.widths)


def test_a_graphed_decoupled_run_equals_its_eager_replay_byte_for_byte():
    from bench.workloads import whisper_as2d as A

    target, drafter = (W.new_state(m) for m in models())
    greedy = A.trajectory(target, SEED, N)
    decode, draft = bound(target, "tiny"), bound(drafter, "draft-tiny")
    fresh = [W.new_state(m) for m in models()]
    for loop in ("serial", "decoupled"):
        live = A.Arm(loop, target, drafter, "oracle", 0.22).run(SEED, N, oracle=greedy)
        schedule = live.schedule if loop == "decoupled" else None
        replay = A.Arm(loop, *fresh, "oracle", 0.22).run(SEED, N, greedy, schedule)
        for field in ("tokens", "schedule", "widths", "accepted", "published"):
            assert getattr(live, field) == getattr(replay, field), (loop, field)
        assert len(set(live.widths)) > 1  # more than one verify width met
        drafted = len(live.published) if loop == "decoupled" else W.POSITIONS
        for mine, theirs, k in ((target, fresh[0], N), (drafter, fresh[1], drafted)):
            pairs = zip(A.committed_cache(mine, k), A.committed_cache(theirs, k), strict=True)
            assert all(torch.equal(x, y) for x, y in pairs), loop
    for binding in (decode, draft):
        s = binding.stats()["callables"]["decode"]
        # every request's prompt call fills its cross-attention cache: eager (the guard)
        assert s["hits"] > 0 and set(s["misses"]) == {"host_guard"}, s


def test_the_vendor_s_assisted_generate_decodes_the_target_s_greedy_tokens():
    from bench.workloads import whisper_as2d as A

    target, drafter = models()
    greedy = A.Arm("alone", W.new_state(target)).run(SEED, N).tokens
    assert W.vendor_greedy(target, SEED, N, assistant=drafter) == greedy


def test_a_bfloat16_decoupled_run_equals_its_eager_replay():
    """The models in bfloat16 (the contracts compiled with it): tier 1 holds as in
    float32; tier 2 is what the run measures, not assumed (verify widths round apart)."""
    from bench.workloads import whisper_as2d as A

    def bf16():
        return [
            W.new_state(W.build_whisper(s, seed=i, dtype=torch.bfloat16))
            for i, s in enumerate(("tiny", "draft-tiny"))
        ]

    (target, drafter), fresh = bf16(), bf16()
    greedy = A.trajectory(target, SEED, N)
    bindings = [bound(target, "tiny"), bound(drafter, "draft-tiny")]
    live = A.Arm("decoupled", target, drafter, "oracle", 0.22).run(SEED, N, oracle=greedy)
    replay = A.Arm("decoupled", *fresh, "oracle", 0.22).run(SEED, N, greedy, live.schedule)
    for field in ("tokens", "schedule", "widths", "accepted", "published"):
        assert getattr(live, field) == getattr(replay, field), field
    pairs = zip(A.committed_cache(target, N), A.committed_cache(fresh[0], N), strict=True)
    assert all(x.dtype == torch.bfloat16 and torch.equal(x, y) for x, y in pairs)
    for binding in bindings:
        assert binding.stats()["callables"]["decode"]["hits"] > 0


def test_the_cost_rule_verifies_what_pays_and_replays_its_decisions():
    """``Budget``'s cost rule: a drafter that never agrees is soon not verified at all
    (its candidates are still compared with what the target commits), a perfect one is
    verified in full, a cost table with a cheap width 5 is used at it; the tokens are the
    target's greedy ones whatever the rule, and a replay on the schedule decides alike."""
    from bench.workloads import whisper_as2d as A

    target, drafter = (W.new_state(m) for m in models())
    greedy = A.trajectory(target, SEED, N)
    flat = {w: 1.0 + 0.1 * w for w in range(1, 10)}
    dip = {**flat, 5: 1.1}  # width 5 nearly as cheap as a greedy step

    def run(source, eps, cost, schedule=None, states=(target, drafter)):
        arm = A.Arm("decoupled", *states, source, eps, cost_ms=cost)
        return arm.run(SEED, N, oracle=greedy, schedule=schedule)

    never = run("drafter", 0.0, flat, schedule=[N] * N)
    assert never.tokens == greedy
    assert never.widths[-10:] == [1] * 10  # acceptance ~ 0: a greedy step each round
    perfect = run("oracle", 0.0, flat, schedule=[N] * N)  # every candidate ready
    assert perfect.tokens == greedy and max(perfect.widths) == 9
    assert sum(perfect.accepted) == N - 1 - len(perfect.widths)
    dipped = run("oracle", 0.3, dip, schedule=[N] * N)
    assert dipped.tokens == greedy and dipped.widths.count(5) > len(dipped.widths) // 2
    fixed = A.Arm("decoupled", target, drafter, "oracle", 0.3).run(SEED, N, greedy, [N] * N)
    assert set(fixed.widths) != set(dipped.widths)
    live = run("oracle", 0.22, dip)
    fresh = tuple(W.new_state(m) for m in models())
    replay = run("oracle", 0.22, dip, schedule=live.schedule, states=fresh)
    for field in ("tokens", "schedule", "widths", "accepted"):
        assert getattr(live, field) == getattr(replay, field), field
