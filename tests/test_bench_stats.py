"""Statistics, aggregation, trace summary and report of bench.token2wav (no model, seconds)."""

from __future__ import annotations

import math

import pytest

from bench import report, stats
from bench.token2wav import CELLS, DEFAULT_CELLS, parse_args, summarize_trace


def _worker(p50: float, sha: str, peak: float | None = 100.0, busy: float | None = None, **kw):
    return {
        "status": "ok",
        "window_ms": [p50 - 2, p50 - 1, p50, p50 + 1, p50 + 10],
        "split": {"flow_ms": [p50 * 0.8], "vocoder_ms": [p50 * 0.1], "other_ms": [p50 * 0.1]},
        "profile": None if busy is None else {"busy_ms": busy, "kernels_per_chunk": 1000.0},
        "memory": None if peak is None else {"process_peak_mib": peak, "window_peak_mib": peak - 1},
        "pcm_sha256": sha,
        **kw,
    }


def test_t975_table():
    assert stats.t975(1) == pytest.approx(12.7062, abs=1e-3)
    assert stats.t975(3) == pytest.approx(3.1824, abs=1e-3)
    assert stats.t975(1000) == pytest.approx(1.96, abs=1e-3)
    with pytest.raises(ValueError):
        stats.t975(0)


def test_percentiles_ignore_missing():
    assert stats.median([3, None, 1, 2]) == 2
    assert stats.percentile([1, 2, 3, 4, 5], 95) == pytest.approx(4.8)
    assert stats.median([]) is None
    assert stats.median([float("nan"), 1.0]) == 1.0


def test_paired_ratio_constant_ratio_has_zero_width():
    r = stats.paired_ratio([2, 4, 6, 8], [1, 2, 3, 4])
    assert r["n"] == 4 and r["geomean"] == pytest.approx(2.0)
    assert r["ci95"] == pytest.approx([2.0, 2.0])
    assert "t-interval" in r["ci_method"]


def test_paired_ratio_interval_matches_hand_computation():
    num, den = [1.0, 2.0, 4.0], [1.0, 1.0, 1.0]
    r = stats.paired_ratio(num, den)
    logs = [math.log(x) for x in num]
    m = sum(logs) / 3
    sd = math.sqrt(sum((x - m) ** 2 for x in logs) / 2)
    half = stats.t975(2) * sd / math.sqrt(3)
    assert r["geomean"] == pytest.approx(2.0)
    assert r["ci95"] == pytest.approx([math.exp(m - half), math.exp(m + half)])
    inv = stats.invert_ratio(r)
    assert inv["geomean"] == pytest.approx(0.5)
    assert inv["ci95"] == pytest.approx([1 / r["ci95"][1], 1 / r["ci95"][0]])


def test_paired_ratio_one_block_and_missing_pairs():
    r = stats.paired_ratio([3.0, None], [1.0, 2.0])
    assert r["n"] == 1 and r["ci95"] is None and "one block" in r["ci_method"]
    assert stats.paired_ratio([None], [1.0]) is None
    assert stats.paired_ratio([0.0], [1.0]) is None


def test_rotate_is_a_cyclic_latin_square():
    cells = ["B0", "S", "SRc"]
    orders = [stats.rotate(cells, k) for k in range(3)]
    assert orders == [["B0", "S", "SRc"], ["S", "SRc", "B0"], ["SRc", "B0", "S"]]
    for pos in range(3):  # every cell once in every position
        assert sorted(o[pos] for o in orders) == sorted(cells)
    assert stats.rotate([], 3) == []


def _blocks():
    return [
        {
            "block": 0,
            "seed": 0,
            "results": {
                "B0": _worker(300.0, "a0", peak=4000.0, busy=60.0),
                "S": _worker(290.0, "a0", peak=2000.0, busy=58.0),
                "SRc": _worker(
                    60.0,
                    "a0",
                    peak=1500.0,
                    busy=56.0,
                    replay={
                        "capture_s": 1.0,
                        "warmup_s": 0.5,
                        "callables": {
                            "flow_chunk": {
                                "hits": 18,
                                "misses": {"signature": 1},
                                "window_hits": 16,
                                "window_misses": {},
                            },
                            "vocoder": {
                                "hits": 19,
                                "misses": {},
                                "window_hits": 16,
                                "window_misses": {},
                            },
                        },
                    },
                ),
                "X": _worker(100.0, "zz"),
            },
        },
        {
            "block": 1,
            "seed": 1,
            "results": {
                "B0": _worker(310.0, "b1", peak=4000.0, busy=61.0),
                "S": {"status": "crash", "error": "worker exited with code -9"},
                "SRc": _worker(
                    62.0,
                    "b1",
                    peak=1500.0,
                    busy=57.0,
                    replay={
                        "capture_s": 2.0,
                        "warmup_s": 0.5,
                        "callables": {
                            "flow_chunk": {
                                "hits": 18,
                                "misses": {"signature": 1},
                                "window_hits": 16,
                                "window_misses": {},
                            }
                        },
                    },
                ),
                "X": _worker(100.0, "b1"),
            },
        },
    ]


def test_aggregate_medians_ratios_exactness_and_failures():
    agg = stats.aggregate(_blocks(), ["B0", "S", "SRc", "X"])
    b0, s, src, x = agg["B0"], agg["S"], agg["SRc"], agg["X"]
    assert b0["exact"] is True and b0["status"] == "ok"
    assert b0["p50_ms"] == pytest.approx(305.0)  # median over blocks of per-block medians
    assert b0["p95_ms"] == pytest.approx(
        stats.median(
            [
                stats.percentile([298, 299, 300, 301, 310], 95),
                stats.percentile([308, 309, 310, 311, 320], 95),
            ]
        )
    )
    # S crashed in block 1: partial, not exact, error recorded, numbers from block 0 only
    assert s["status"] == "partial" and s["exact"] is False and s["exact_blocks"] == "1/2"
    assert s["errors"][0]["block"] == 1 and "-9" in s["errors"][0]["error"]
    assert s["p50_ms"] == pytest.approx(290.0)
    assert s["speedup_vs_B0"]["n"] == 1 and s["speedup_vs_B0"]["ci95"] is None
    # SRc exact in every block, paired speedup = geomean of 300/60 and 310/62 = 5
    assert src["exact"] is True and src["exact_blocks"] == "2/2"
    assert src["speedup_vs_B0"]["geomean"] == pytest.approx(5.0)
    assert src["speedup_vs_B0"]["ci95"] == pytest.approx([5.0, 5.0])
    assert src["peak_ratio_vs_B0"]["geomean"] == pytest.approx(1500 / 4000)
    assert src["wall_over_busy"] == pytest.approx(61.0 / 56.5)
    rep = src["replay"]
    assert rep["window_hits"] == 16 + 16 + 16 and rep["misses"] == {"signature": 2}
    assert rep["capture_s"] == pytest.approx(1.5)
    # X matches B0 in one block only
    assert x["exact"] is False and x["exact_blocks"] == "1/2"
    assert agg["B0"]["replay"] is None


def test_aggregate_without_reference_is_never_exact():
    blocks = [{"block": 0, "results": {"S": _worker(10.0, "a")}}]
    agg = stats.aggregate(blocks, ["S"])
    assert agg["S"]["exact"] is False and agg["S"]["speedup_vs_B0"] is None


def test_summarize_trace_counts_and_attribution():
    ev = [
        {"ph": "X", "cat": "user_annotation", "name": "bench::chunk", "ts": 0, "dur": 100},
        {"ph": "X", "cat": "user_annotation", "name": "bench::flow", "ts": 0, "dur": 50},
        {"ph": "X", "cat": "user_annotation", "name": "bench::vocoder", "ts": 60, "dur": 30},
        {"ph": "X", "cat": "kernel", "name": "k1", "ts": 10, "dur": 20},
        {"ph": "X", "cat": "kernel", "name": "k2", "ts": 40, "dur": 5},
        {"ph": "X", "cat": "kernel", "name": "k3", "ts": 70, "dur": 10},
        {"ph": "X", "cat": "kernel", "name": "k4", "ts": 95, "dur": 1},
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoH", "ts": 96, "dur": 2},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 9, "dur": 1},
        {"ph": "X", "cat": "cuda_driver", "name": "cuLaunchKernel", "ts": 39, "dur": 1},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "ts": 69, "dur": 1},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaMemcpyAsync", "ts": 95, "dur": 1},
        {"ph": "i", "cat": "kernel", "name": "instant", "ts": 1},
    ]
    s = summarize_trace(ev, n_chunks=2)
    assert s["busy_ms"] == pytest.approx(36 / 1e3 / 2)
    assert s["kernels_per_chunk"] == 2.0
    assert s["kernel_launch_calls_per_chunk"] == 1.0 and s["graph_launch_calls_per_chunk"] == 0.5
    assert s["flow_busy_ms"] == pytest.approx(25 / 1e3 / 2)
    assert s["vocoder_busy_ms"] == pytest.approx(10 / 1e3 / 2)
    assert s["other_busy_ms"] == pytest.approx(1 / 1e3 / 2)
    assert s["memcpy_ms"] == pytest.approx(2 / 1e3 / 2)


def test_cli_defaults_and_quick():
    a = parse_args(["--device", "cpu"])
    assert a.cells == DEFAULT_CELLS and a.blocks == 4 and a.chunks == 16 and a.warmup == 3
    assert all(CELLS[c].implemented for c in DEFAULT_CELLS)
    q = parse_args(["--quick", "--chunks", "3"])
    assert q.device == "cpu" and q.cells == ["B0", "S"] and q.blocks == 1 and q.chunks == 3
    with pytest.raises(SystemExit):
        parse_args(["--cells", "B0,nope"])
    for name, c in CELLS.items():  # nothing unimplemented goes without a reason
        assert c.implemented or c.reason, name


def test_markdown_and_plot(tmp_path):
    blocks = _blocks()
    cells = ["B0", "S", "SRc"]
    agg = stats.aggregate(blocks, cells)
    doc = {
        "command": "python -m bench.token2wav --x",
        "git_commit": "abc",
        "settings": {"blocks": 2, "chunks": 4, "warmup": 1, "block_seeds": [0, 1]},
        "determinism": {"envelope": {"cudnn.deterministic": True}, "held_in_every_worker": True},
        "method": {"ratios": "a; b"},
        "cells": {
            **{c: {"what": c, **agg[c]} for c in cells},
            "R": {"status": "not implemented", "what": "r", "reason": "because"},
        },
    }
    md = report.markdown(doc)
    assert "| SRc | yes | 61.0 |" in md and "5.00×" in md
    assert "**R** (not implemented)" in md and "S** partial" in md
    note = report.plot(doc, tmp_path / "x.png")
    if note is None:
        assert (tmp_path / "x.png").stat().st_size > 1000
    else:
        assert "matplotlib" in note


def test_rerender_rewrites_json_md_png(tmp_path):
    import json

    from bench.token2wav import rerender

    doc = {
        "command": "python -m bench.token2wav",
        "settings": {"cells": ["B0", "S", "SRc"], "blocks": 2},
        "cells": {"B0": {"what": "b0"}, "R": {"status": "not implemented", "reason": "r"}},
        "blocks": _blocks(),
    }
    path = tmp_path / "r.json"
    path.write_text(json.dumps(doc))
    assert rerender(path) == 0
    out = json.loads(path.read_text())
    assert out["cells"]["SRc"]["exact"] is True and out["cells"]["R"]["status"] == "not implemented"
    assert "| SRc | yes |" in (tmp_path / "r.md").read_text()
