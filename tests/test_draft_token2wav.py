"""`clockc draft` on the released Token2Wav (minicpmo-utils 1.0.6, seeded weights, CPU).

KNOWN GAP (the test is a strict xfail until fixed): see the xfail reason below. It runs
with ``pytest --known-gaps`` only (74 s and 14 GiB peak on 2 cores; tests/conftest.py).

The trace of five steady chunks of the vendor's own `Token2wav.stream()` must find the
two hot callables (`flow.inference_chunk`, `hift.forward`) and the estimator and
conformer attention carries with the stock retention, head(302) ++ tail(100) in storage
order, attended from 302 by 50 until 402, at their `stream_cache` sites, and the draft
must check clean.

Differences from the shipped `contracts/stepaudio2_token2wav.clock` (what a trace cannot
infer, each also said in the draft's comments):
  * the solver and DiT workspaces (`att_cache_buffer`s) are declared at their stock size
    (`allocate stock`): their demand envelope, extent(estimator_carry) + 56 frames, is a
    human decision the trace never sees (the shipped contract halves the memory with it);
  * the conv caches the flow writes in place (`cnn_cache_buffer`s) are regions written by
    `flow_chunk` (turn if read back) but their arguments are staged, not aliased;
  * the final chunk (last_chunk true, 56 frames; the vocoder's (64, 3840) and (56, 0)) is
    never traced, so its classes are absent and it would run eager;
  * the vendor's `autocast("cuda", float32/float16)` is off on CPU, so no ambient states;
  * no `determinism` settings and no host-built constants (`constant` blocks): only a CUDA
    run shows host syncs and cuDNN nondeterminism;
  * the hift mel cache is staged inside `speech_feat` (config on its frame count), and
    lifetimes are `turn` by guess (no turn boundary in the trace);
  * the estimator carry's product clock `solve = (step, frame)` is not inferred: one
    frame clock of 50 per chunk serves both carries.
"""

from __future__ import annotations

import gc

import pytest

from bench.workloads import unavailable_reason

pytestmark = [pytest.mark.slow, pytest.mark.known_gap]

_REASON = unavailable_reason("token2wav")
if _REASON is not None:
    pytest.skip(_REASON, allow_module_level=True)

from bench.workloads import token2wav as W  # noqa: E402

from duplexcadence.compiler.draft import render_draft  # noqa: E402
from duplexcadence.compiler.driver import check_source  # noqa: E402
from duplexcadence.runtime.tools.streams import StreamSpec  # noqa: E402
from duplexcadence.runtime.tools.trace_draft import trace_stream  # noqa: E402

SEED = 0


def token2wav_stream() -> StreamSpec:
    """Steady chunks of the vendor's stream() (no final chunk: its 56 frames are another
    configuration, left to the contract's author)."""

    def drive(t2w, chunks):
        for chunk in W.token_stream(SEED, chunks + 1)[:chunks]:
            yield W.stream_chunk(t2w, chunk.tokens, chunk.last_chunk)

    return StreamSpec(build=lambda: W.build_token2wav(SEED), drive=drive)


@pytest.mark.xfail(
    strict=True,
    reason="observed on CPU (one 33 min run under load): the draft finds both hot callables, "
    "HiFT's source cache as a window(3840) carry and the flow's in-place buffers, but not the "
    "estimator and conformer carries: the stock passes them as views of the workspace "
    "att_cache_buffer that the call rewrites in place, and the grown-by-cat test on them "
    "failed (cause not yet diagnosed); they are drafted as staged arguments instead",
)
def test_draft_finds_the_stock_carries_and_checks():
    trace = trace_stream(token2wav_stream(), 5)
    gc.collect()
    text = render_draft(trace, "stepaudio2_token2wav_draft", source="token2wav_stream")
    print(text)
    assert [k.name for k in trace.callables] == ["flow_inference_chunk", "hift"]
    carries = {c.label: c for c in trace.carries}
    assert set(carries) == {"estimator_att_cache", "conformer_att_cache"}
    for label, axis in (("estimator_att_cache", 4), ("conformer_att_cache", 3)):
        c = carries[label]
        assert c.retention == ("head_tail", (302, 100)), label
        assert (c.axis, c.stride, c.extents[:3]) == (axis, 50, [302, 352, 402])
        assert c.site == (("attr", "stream_cache"), ("key", label))
        assert c.result == (("index", 1), ("key", label))
    assert not check_source(text, "draft.clock").diagnostics
    assert "retention head(302 frame) ++ tail(100 frame)" in text
    assert "attended from 302 frame by 50 frame until 402 frame" in text
