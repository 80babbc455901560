"""bench/diffuplex.py (issue 26): the headline it computes from a finished document
(LM time per interaction second, frames per wake, the replay checks that must fail on a
changed decision or an eager call), and its CPU smoke run on the tiny LM (slow): the
W = 1 loop equals LMGen's bytes and the graphed wake cell its eager one."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("pandas", reason="the benchmark harness needs: pip install -e '.[bench]'")

from bench import diffuplex as D  # noqa: E402
from bench.workloads import unavailable_reason  # noqa: E402


def result(calls: list, frames: int, wakes: list | None = None, misses: int = 0) -> dict:
    r = {"status": "ok", "lm_calls_by_phase": {"warmup": [["wake", 9, 500.0]], "window": calls}}
    r["window_ms"] = [10.0] * frames
    if wakes is not None:
        r["wakes"] = wakes
    r["replay"] = {"callables": {"backbone": {"misses": {"no_class": misses} if misses else {}}}}
    return r


def doc(adapter_wakes: list, misses: int = 0, exact: bool = True) -> dict:
    wakes = [[0, 1, 6, 6], [6, 6, 1, 1], [7, 1, 8, 3], [10, 3, 1, 1]]
    voiced = [["wake_depformer", r, 5.0] for _, _, r, _ in wakes]  # inside each wake
    results = {
        "ar_adapter": result([["step", 1, 20.0]] * 10, 10),
        "w8": result(
            [["wake", 8, 40.0], ["wake", 13, 50.0], ["wake", 8, 40.0], ["wake", 10, 45.0]] + voiced,
            10,
            wakes,
        ),
        "w8_adapter": result(
            [["wake", 8, 30.0], ["wake", 13, 36.0], ["wake", 8, 30.0], ["wake", 10, 33.0]] + voiced,
            10,
            adapter_wakes,
            misses,
        ),
    }
    cells = {"w8_adapter": {"exact": exact}, "w8": {"exact": True}}
    return {"blocks": [{"results": results}], "cells": cells, "settings": {"policy": "listen"}}


def test_lm_time_frames_per_wake_and_the_replay_checks() -> None:
    wakes = [[0, 1, 6, 6], [6, 6, 1, 1], [7, 1, 8, 3], [10, 3, 1, 1]]
    d = doc(wakes)
    lm = D.cell_lm(d, "w8_adapter")
    wake = lm["parts"]["wake"]
    assert wake["calls"] == 4 and lm["wake_by_query"][8]["n"] == 2  # the warm-up's left out
    assert wake["ms_per_s"] == pytest.approx(129.0 / 0.8)  # 10 frames of 80 ms
    # a wake's depformer call is timed inside it: shown, not counted twice
    assert lm["parts"]["wake_depformer"]["ms_per_s"] == pytest.approx(20.0 / 0.8)
    assert lm["lm_ms_per_s"] == pytest.approx(129.0 / 0.8)
    assert D.cell_lm(d, "ar_adapter")["lm_ms_per_s"] == pytest.approx(200.0 / 0.8)
    assert D.frames_per_wake(d, "w8") == pytest.approx((6 + 1 + 3) / 3)  # last wake cut
    head = D.headline(d)
    assert head["replay_equals_eager"] is True
    assert head["lm_time_ratio_ar_adapter_vs_w16_adapter"] is None  # no w16 cell
    assert head["wake_cost_vs_ar_step"] is None  # no ar_vendor cell
    assert head["replay_checks"]["w8_adapter"]["query_lengths_met"] == [8, 9, 10, 13]
    changed = [*wakes[:2], [7, 1, 7, 3], wakes[3]]  # one retained count differs
    assert D.headline(doc(changed))["replay_equals_eager"] is False
    assert D.headline(doc(wakes, misses=1))["replay_equals_eager"] is False
    assert D.headline(doc(wakes, exact=False))["replay_equals_eager"] is False


@pytest.mark.slow
@pytest.mark.skipif(unavailable_reason("moshi") is not None, reason="moshi is not installed")
def test_the_smoke_run_has_w1_equal_to_lmgen_and_wakes_replayed_equal(tmp_path) -> None:
    out = tmp_path / "d"
    cmd = [sys.executable, "-m", "bench.diffuplex", "--quick", "--quiet-workers"]
    subprocess.run([*cmd, "--out", str(out)], check=True, capture_output=True, timeout=900)
    d = json.loads(out.with_suffix(".json").read_text())
    assert d["w1_equals_lmgen"] is True
    assert d["cells"]["w8_adapter"]["exact"] is True  # bytes: simulate-free CPU, eager
    assert d["replay_checks"]["w8_adapter"]["decisions_equal"] is True
    assert d["frames_per_wake"]["w8"] > 1.5
    assert d["replay_checks"]["w8_adapter"]["eager_calls"] > 0  # no CUDA: nothing replays
