"""DiffuPlex's rolling wakes over moshi 0.2.13's LMModel (bench/workloads/moshi_wake.py),
on the tiny LM in bfloat16 on the CPU: at W = 1 the loop is the vendor's LMGen.step loop
bit for bit (token IDs and float32 PCM, greedy and sampled with the same seed); at W > 1
every wake leaves the backbone's streaming state at its committed end (the masked
entries rewound), the decisions follow the seeded schedule, and a fresh run of the same
loop reproduces every token, PCM sample and wake."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from bench.workloads import unavailable_reason

pytestmark = pytest.mark.slow

_REASON = unavailable_reason("moshi")
if _REASON is not None:
    pytest.skip(_REASON, allow_module_level=True)

from bench.workloads import moshi as M  # noqa: E402
from bench.workloads import moshi_wake as MW  # noqa: E402

SEED = 0
FRAMES = 40
DTYPE = torch.bfloat16
SAMPLING_SEED = 100


def frames_out(mimi, step) -> tuple[list, list]:
    """Per frame: the played IDs (None in the warm-up) and their decoded float32 PCM."""
    ids, pcm = [], []
    with torch.no_grad():
        for chunk in M.pcm_stream(SEED, FRAMES):
            tokens = step(mimi.encode(chunk))
            ids.append(None if tokens is None else tokens[0, :, 0].tolist())
            pcm.append(None if tokens is None else mimi.decode(tokens[:, 1:]).clone())
    return ids, pcm


def vendor(greedy: bool) -> tuple[list, list]:
    mimi, lm_gen = M.build_moshi(SEED, "cpu", DTYPE, M.TINY_LM_KWARGS, greedy=greedy)
    torch.manual_seed(SAMPLING_SEED)
    return frames_out(mimi, lm_gen.step)


def rolling(greedy: bool, window: int, schedule_seed: int = 5) -> tuple[list, list, Any]:
    mimi, lm_gen = M.build_moshi(SEED, "cpu", DTYPE, M.TINY_LM_KWARGS, greedy=greedy, start=False)
    mimi.streaming_forever(1)
    lm_gen.lm_model.streaming_forever(1)
    schedule = MW.Schedule(schedule_seed, window, p_run=0.5, min_run=2, hazard=0.3)
    loop = MW.RollingWakes(lm_gen, window, schedule, seed=SEED)
    torch.manual_seed(SAMPLING_SEED)
    ids, pcm = frames_out(mimi, loop.tick)
    return ids, pcm, loop


def same(a: list, b: list) -> bool:
    return all(
        (x is None and y is None) or (x is not None and y is not None and torch.equal(x, y))
        for x, y in zip(a, b, strict=True)
    )


@pytest.mark.parametrize("greedy", [True, False], ids=["greedy", "sampled"])
def test_one_frame_wakes_are_the_vendor_loop_bit_for_bit(greedy: bool) -> None:
    ids, pcm = vendor(greedy)
    mine_ids, mine_pcm, loop = rolling(greedy, window=1)
    assert mine_ids == ids and same(mine_pcm, pcm)
    assert sum(x is not None for x in ids) == FRAMES - 1  # past LMGen's one-frame warm-up
    assert [(w.c, w.r, w.k) for w in loop.wakes] == [(1, 1, 1)] * FRAMES


def committed(loop: MW.RollingWakes) -> set[int]:
    """Every position counter of the backbone's streaming state."""
    from moshi.modules.transformer import RingKVCache

    seen = set()
    for module in loop.lm.transformer.modules():
        state = getattr(module, "_streaming_state", None)
        if state is None:
            continue
        for name in ("offsets", "offset"):
            if isinstance(getattr(state, name, None), torch.Tensor):
                seen.add(int(getattr(state, name)))
        if hasattr(state, "offset_cpu"):
            seen.add(state.offset_cpu)
        if isinstance(getattr(state, "kv_cache", None), RingKVCache):
            seen.add(int(state.kv_cache.end_offset))
    return seen


def test_wakes_of_four_rewind_to_the_committed_end_and_reproduce() -> None:
    mimi, lm_gen = M.build_moshi(SEED, "cpu", DTYPE, M.TINY_LM_KWARGS, greedy=True, start=False)
    mimi.streaming_forever(1)
    lm_gen.lm_model.streaming_forever(1)
    loop = MW.RollingWakes(
        lm_gen, 4, MW.Schedule(5, 4, p_run=0.5, min_run=2, hazard=0.3), seed=SEED
    )
    after_wake = []
    with torch.no_grad():
        for chunk in M.pcm_stream(SEED, FRAMES):
            n = len(loop.wakes)
            loop.tick(mimi.encode(chunk))
            if len(loop.wakes) > n:  # a wake ran: every counter at the committed end
                after_wake.append((committed(loop), loop.fed))
    assert all(seen == {fed} for seen, fed in after_wake), after_wake
    wakes = loop.wakes
    assert FRAMES - wakes[-1].k <= sum(w.k for w in wakes[:-1]) <= FRAMES - 1  # one a tick
    assert all(1 <= w.k <= w.r <= 4 for w in wakes)
    assert [w.c for w in wakes[1:]] == [w.k for w in wakes[:-1]]  # realized = played since
    assert any(w.k < w.r for w in wakes) and any(w.k > 1 for w in wakes)  # revisions, runs
    # a fresh run of the same loop: every token, PCM sample and decision again
    ids, pcm, again = rolling(True, window=4)
    ids2, pcm2, again2 = rolling(True, window=4)
    assert ids == ids2 and same(pcm, pcm2) and again.wakes == again2.wakes == wakes
    assert ids != vendor(True)[0]  # W = 4 is another algorithm (masked positions, LoRA)


def test_a_wake_voices_its_retained_frames_in_one_depformer_call() -> None:
    """Each wake calls the vendor's depformer once, its r retained frames as r rows; row
    h - 1's audio codebooks are what frame t + h plays (each codebook at its delay), for
    every frame played before the next wake."""
    mimi, lm_gen = M.build_moshi(SEED, "cpu", DTYPE, M.TINY_LM_KWARGS, greedy=True, start=False)
    mimi.streaming_forever(1)
    lm_gen.lm_model.streaming_forever(1)
    calls, depformer = [], lm_gen.depformer_step

    def recorded(text_token, transformer_out):
        audio = depformer(text_token, transformer_out)
        calls.append((text_token.clone(), transformer_out.shape, audio.clone()))
        return audio

    lm_gen.depformer_step = recorded
    loop = MW.RollingWakes(lm_gen, 4, MW.Schedule(5, 4, 0.5, 2, 0.3), seed=SEED)
    ids, _ = frames_out(mimi, loop.tick)
    assert len(calls) == len(loop.wakes)
    checked = 0
    for wake, (texts, shape, audio) in zip(loop.wakes, calls, strict=True):
        assert tuple(shape) == (wake.r, 1, loop.lm.dim) and audio.shape[0] == wake.r
        for h in range(1, wake.k + 1):
            for j in range(loop.depth):  # text, then the audio codebooks at their delays
                i = wake.tick + h + loop.max_delay - loop.delays[j] - 1  # the frame that plays it
                if 0 <= i < FRAMES and ids[i] is not None:
                    want = texts[h - 1] if j == 0 else audio[h - 1, j - 1]
                    assert ids[i][j] == int(want), (wake, h, j)
                    checked += 1
    assert checked > FRAMES * loop.depth // 2
    assert any(w.r > 1 for w in loop.wakes)


@pytest.mark.parametrize(
    "policy, frames_per_wake, before_revision", [("listen", 1.98, 4.24), ("speak", 2.26, 3.79)]
)
def test_schedules_are_calibrated_to_the_paper(policy, frames_per_wake, before_revision) -> None:
    """At W = 16 the seeded schedule plays as many frames a wake as the paper's timing
    subset, and as many before a revision; a schedule replays from its seed."""
    make = getattr(MW.Schedule, policy)
    schedule = make(3, 16)
    drawn = [schedule.decide() for _ in range(40000)]
    assert make(3, 16).decide() == drawn[0]  # a fresh schedule draws the same
    played = [k for _, k in drawn]
    revised = [k for r, k in drawn if k < r]
    assert abs(sum(played) / len(played) - frames_per_wake) < 0.06
    assert abs(sum(revised) / len(revised) - before_revision) < 0.12
    minimum = 6 if policy == "listen" else 2
    assert min(r for r, _ in drawn if r > 1) == minimum


def test_the_confidence_rule_retains_by_state_and_probability() -> None:
    rule = MW.ConfidenceRule(0, 6, "listen", threshold=0.5, pad=3)
    texts, sure = [9, 3, 3, 3, 3, 3], [0.1] + [0.9] * 5
    assert rule.decide(texts, sure)[0] == 6  # h = 2..6 all PAD, confident
    assert rule.decide(texts[:4] + [7, 3], sure)[0] == 1  # a run of 4 < Listen's 6
    speak = MW.ConfidenceRule(0, 6, "speak", threshold=0.5, pad=3)
    assert speak.decide([9, 7, 0, 5, 3, 3], [0.1, 0.9, 0.9, 0.2, 0.9, 0.9])[0] == 3
    assert speak.decide([9, 7, 0, 5, 3, 3], [0.1, 0.4, 0.9, 0.9, 0.9, 0.9])[0] == 1


def test_a_rule_driven_wake_loop_runs_and_reproduces() -> None:
    """The sanity arm on the tiny LM: the rule reads every drafted token of each wake."""

    def run() -> tuple[list, list]:
        mimi, lm_gen = M.build_moshi(SEED, "cpu", DTYPE, M.TINY_LM_KWARGS, greedy=True, start=False)
        mimi.streaming_forever(1)
        lm_gen.lm_model.streaming_forever(1)
        lm = lm_gen.lm_model
        rule = MW.ConfidenceRule(1, 4, "speak", 0.0, lm.existing_text_padding_id)
        loop = MW.RollingWakes(lm_gen, 4, rule, seed=SEED)
        ids, _ = frames_out(mimi, loop.tick)
        return ids, loop.wakes

    (ids, wakes), (ids2, wakes2) = run(), run()
    assert ids == ids2 and wakes == wakes2
    assert all(w.r == 4 for w in wakes)  # threshold 0: every drafted frame is kept


def test_widened_rings_keep_every_key_a_wake_attends() -> None:
    """A context of 8 frames, so 60 frames wrap the rings many times (float32: the
    token IDs compare the attended keys, not a reduction order, which a wrapped ring
    permutes). Rings widened by 2W - 2 (what RollingWakes does) decode as rings too wide
    to wrap; the vendor's capacity (= context) loses keys under multi-frame wakes."""
    from moshi.modules.transformer import RingKVCache

    def run(extra: int | None) -> tuple[list, set]:
        kwargs = {**M.TINY_LM_KWARGS, "context": 8}
        mimi, lm_gen = M.build_moshi(SEED, "cpu", torch.float32, kwargs, greedy=True, start=False)
        mimi.streaming_forever(1)
        lm_gen.lm_model.streaming_forever(1)
        widen = MW.widen_rings
        if extra is not None:  # another width than the loop's own, or none
            MW.widen_rings = lambda t, _: widen(t, extra) if extra else 0
        try:
            loop = MW.RollingWakes(lm_gen, 4, MW.Schedule(5, 4, 0.5, 2, 0.3), seed=SEED)
        finally:
            MW.widen_rings = widen
        states = [getattr(m, "_streaming_state", None) for m in loop.lm.transformer.modules()]
        caches = [getattr(state, "kv_cache", None) for state in states]
        rings = {c.capacity for c in caches if isinstance(c, RingKVCache)}
        ids = []
        with torch.no_grad():
            for chunk in M.pcm_stream(SEED, 60):
                tokens = loop.tick(mimi.encode(chunk))
                ids.append(None if tokens is None else tokens[0, :, 0].tolist())
        return ids, rings

    (mine, rings), (wide, _), (stock, stock_rings) = run(None), run(1000), run(0)
    assert rings == {8 + 6} and stock_rings == {8}
    assert mine == wide
    assert sum(a != b for a, b in zip(stock, wide)) > 10


def test_a_graphed_wake_loop_equals_its_eager_run_byte_for_byte() -> None:
    """The backbone bound by its generated contract (moshi_wake.contract_text: one class
    per query length W .. 2W - 1; the simulate backend on the CPU): every wake replays,
    and the run's token IDs, float32 PCM and decisions equal the eager loop's."""
    ids, pcm, eager = rolling(True, window=4)
    mimi, lm_gen = M.build_moshi(SEED, "cpu", DTYPE, M.TINY_LM_KWARGS, greedy=True, start=False)
    mimi.streaming_forever(1)
    lm_gen.lm_model.streaming_forever(1)
    schedule = MW.Schedule(5, 4, p_run=0.5, min_run=2, hazard=0.3)
    loop = MW.RollingWakes(lm_gen, 4, schedule, seed=SEED)
    binding = MW.bind_adapter(loop, "cpu", backend="simulate")
    torch.manual_seed(SAMPLING_SEED)
    graphed_ids, graphed_pcm = frames_out(mimi, loop.tick)
    assert graphed_ids == ids and same(graphed_pcm, pcm) and loop.wakes == eager.wakes
    stats = binding.stats()["callables"]
    assert stats["backbone"]["hits"] == len(loop.wakes) and not stats["backbone"]["misses"]
    # one depformer call per wake, over its r retained frames as r rows
    assert stats["depformer"]["hits"] == len(loop.wakes) and not stats["depformer"]["misses"]
    assert {w.r for w in loop.wakes} > {1}  # several row counts replayed, each its class
    assert {w.c + 3 for w in loop.wakes} <= {4, 5, 6, 7}  # q = c + W - 1: the catalog


def test_the_wake_contract_refuses_the_vendor_s_ring() -> None:
    """contract_text documents the rings as one speculative region: at the widened
    capacity it checks; at the vendor's (= context) clockc refuses it (CLK052)."""
    from duplexcadence.compiler.driver import check_source

    mimi, lm_gen = M.build_moshi(SEED, "cpu", DTYPE, M.TINY_LM_KWARGS, greedy=True, start=False)
    lm_gen.lm_model.streaming_forever(1)
    loop = MW.RollingWakes(lm_gen, 16, MW.Schedule.listen(0, 16), seed=SEED)
    text = MW.contract_text(MW.wake_shape(loop))
    result = check_source(text, "moshi_wake.clock")
    assert result.ok, result.diagnostics
    backbone, depformer = result.analysis.callables
    assert depformer.width == 16  # the vendor's depformer step: one class per r = 1..W
    assert backbone.width == 16 and backbone.commits[0][0] == "lm_kv"
    kv = next(r for r in result.analysis.regions if r.name == "lm_kv")
    assert (kv.speculative, kv.bound, kv.envelope) == (30, 3000, 3030)
    stock = check_source(text.replace("ring(3030 frame)", "ring(3000 frame)"), "s.clock")
    assert [d.code for d in stock.diagnostics if d.severity.name == "ERROR"] == ["CLK052"]


def test_the_shipped_wake_contract_is_contract_text_at_the_7b_shape() -> None:
    from pathlib import Path

    shipped = (Path(__file__).parents[1] / "contracts" / "moshi_wake.clock").read_text()
    assert shipped.endswith(MW.contract_text(MW.SHAPE_7B))
    assert MW.SHAPE_7B.ring == MW.SHAPE_7B.context + 2 * MW.SHAPE_7B.window - 2


def test_a_rewind_follows_a_restarted_stream() -> None:
    """Rewind collects the streaming counters once per stream: after the stream is
    stopped and started again (new state objects) it moves the new ones, not the old."""
    _, lm_gen = M.build_moshi(SEED, "cpu", DTYPE, M.TINY_LM_KWARGS, greedy=True, start=False)
    lm = lm_gen.lm_model
    lm.streaming_forever(1)
    rewind = MW.Rewind(lm.transformer)
    rewind(0, 5)
    old = lm.transformer._streaming_state
    lm._stop_streaming()
    lm.streaming_forever(1)
    assert lm.transformer._streaming_state is not old
    with torch.no_grad():
        lm.forward_text(torch.zeros(1, lm.num_codebooks, 3, dtype=torch.long))
    assert committed(_Loop(lm)) == {3}
    rewind(2, 1)
    assert committed(_Loop(lm)) == {1}


class _Loop:
    """What ``committed`` reads of a loop: its LM."""

    def __init__(self, lm) -> None:
        self.lm = lm
