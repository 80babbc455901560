"""Aggregation, exactness, budget and report logic of bench.moshi on synthetic worker
records (no model is built; seconds on a CPU)."""

from __future__ import annotations

import json

import pytest

from bench import moshi as M


def _worker(p50, tok="t", pcm="p", peak=100.0, busy=None, frames=4, **kw):
    return {
        "status": "ok",
        "window_ms": [p50 - 2, p50 - 1, p50, p50 + 1, p50 + 10],
        "profile": (
            None
            if busy is None
            else {
                "busy_ms": busy,
                "kernels_per_frame": 500.0,
                "kernel_launch_calls_per_frame": 480.0,
                "graph_launch_calls_per_frame": 0.0,
            }
        ),
        "memory": None if peak is None else {"process_peak_mib": peak, "window_peak_mib": peak - 1},
        "tokens_sha256": tok,
        "pcm_sha256": pcm,
        "frame_tokens_sha256": [None] + [f"{tok}{i}" for i in range(1, frames)],
        "frame_pcm_sha256": [None] + [f"{pcm}{i}" for i in range(1, frames)],
        "timings_s": {"setup": 0.5, "build": 3.0},
        **kw,
    }


def _blocks(rows):
    return [
        {"block": b, "seed": b, "order": list(r), "results": dict(r)} for b, r in enumerate(rows)
    ]


def test_exact_and_ratios_vs_eager_and_vendor():
    blocks = _blocks(
        [
            {
                "eager": _worker(200, busy=150, peak=1000),
                "vendor": _worker(25, busy=20, peak=1100),
                "adapter": _worker(20, busy=19, peak=1050),
            },
            {
                "eager": _worker(220, busy=150, peak=1000),
                "vendor": _worker(22, busy=20, peak=1100),
                "adapter": _worker(22, busy=19, peak=1050),
            },
        ]
    )
    agg = M.aggregate(blocks, ["eager", "vendor", "adapter"])
    assert agg["eager"]["exact"] and agg["eager"]["exact_note"] == "reference"
    assert agg["vendor"]["exact"] and agg["adapter"]["exact"]
    assert agg["adapter"]["exact_blocks"] == "2/2"
    assert agg["adapter"]["p50_ms"] == pytest.approx(21.0)
    sp = agg["adapter"]["speedup_vs_eager"]
    assert sp["ratios"] == pytest.approx([10.0, 10.0]) and sp["ci95"] == pytest.approx([10.0, 10.0])
    assert agg["adapter"]["speedup_vs_vendor"]["ratios"] == pytest.approx([1.25, 1.0])
    assert agg["vendor"]["p50_ratio_vs_eager"]["ratios"] == pytest.approx([0.125, 0.1])
    assert "speedup_vs_eager" not in agg["eager"] and "speedup_vs_vendor" not in agg["vendor"]
    assert agg["adapter"]["peak_ratio_vs_eager"]["geomean"] == pytest.approx(1.05)
    assert agg["adapter"]["busy_ms"] == pytest.approx(19.0)
    assert agg["adapter"]["replay"] is None
    for c in agg.values():
        assert c["status"] == "ok" and c["blocks_ok"] == "2/2"


def test_token_sha_difference_is_not_exact_and_is_located():
    good = _worker(200)
    bad = _worker(20, tok="x")  # same PCM, different token IDs
    bad["frame_tokens_sha256"] = list(good["frame_tokens_sha256"])
    bad["frame_tokens_sha256"][2] = "different"
    agg = M.aggregate(_blocks([{"eager": good, "adapter": bad}]), ["eager", "adapter"])
    a = agg["adapter"]
    assert a["exact"] is False and a["exact_blocks"] == "0/1"
    assert a["first_divergence"] == [{"block": 0, "what": "tokens", "frame": 2}]
    # a PCM-only difference is not exact either
    agg = M.aggregate(
        _blocks([{"eager": good, "adapter": _worker(20, pcm="q")}]), ["eager", "adapter"]
    )
    assert agg["adapter"]["exact"] is False
    assert agg["adapter"]["first_divergence"][0]["what"] in ("tokens", "pcm")


def test_first_divergence_pcm_and_frame_counts():
    a, b = _worker(1), _worker(1)
    b["frame_pcm_sha256"] = list(a["frame_pcm_sha256"])
    b["frame_pcm_sha256"][3] = "z"
    assert M.first_divergence(a, b) == {"what": "pcm", "frame": 3}
    assert M.first_divergence(a, dict(a)) is None
    c = _worker(1, frames=5)
    assert M.first_divergence(a, c)["note"] == "different frame counts"
    assert M.first_divergence(a, {"status": "error"}) is None


def test_failure_records_propagate():
    err = {
        "status": "error",
        "error": "RuntimeError: bench.workloads.moshi.bind_adapter does not exist",
    }
    blocks = _blocks([{"eager": _worker(200), "adapter": err}])
    agg = M.aggregate(blocks, ["eager", "adapter"])
    a = agg["adapter"]
    assert a["status"] == "failed" and a["exact"] is False and a["p50_ms"] is None
    assert a["errors"] == [{"block": 0, "status": "error", "error": err["error"]}]
    assert a["speedup_vs_eager"] is None
    md = M.markdown({"cells": {n: {"what": "", **c} for n, c in agg.items()}, "settings": {}})
    assert "| adapter | failed |" in md and "bind_adapter does not exist" in md
    header = next(line for line in md.splitlines() if line.startswith("| cell |"))
    failed = next(line for line in md.splitlines() if line.startswith("| adapter |"))
    assert header.count("|") == failed.count("|")


def test_eager_failure_leaves_nothing_to_compare():
    blocks = _blocks(
        [
            {"eager": _worker(200), "adapter": _worker(20)},
            {"eager": {"status": "crash", "error": "boom"}, "adapter": _worker(21)},
        ]
    )
    agg = M.aggregate(blocks, ["eager", "adapter"])
    assert agg["eager"]["status"] == "partial"
    a = agg["adapter"]
    assert a["status"] == "ok" and a["exact"] is True and a["exact_blocks"] == "1/1"
    assert "without an eager result" in a["exact_note"]
    assert a["speedup_vs_eager"]["n"] == 1 and a["speedup_vs_eager"]["ci95"] is None
    # no eager at all: never exact
    agg = M.aggregate(_blocks([{"adapter": _worker(20)}]), ["adapter"])
    assert agg["adapter"]["exact"] is False and agg["adapter"]["exact_blocks"] == "0/0"


def test_skipped_blocks_make_cells_partial():
    blocks = _blocks(
        [
            {"eager": _worker(200), "vendor": _worker(25)},
            {
                "vendor": M.skipped_record("vendor", 1, 1, "--time-budget"),
                "eager": M.skipped_record("eager", 1, 1, "--time-budget"),
            },
        ]
    )
    agg = M.aggregate(blocks, ["eager", "vendor"])
    assert agg["vendor"]["status"] == "partial" and agg["vendor"]["blocks_ok"] == "1/2"
    assert agg["vendor"]["exact"] is True
    assert agg["vendor"]["errors"][0]["status"] == "skipped"


def test_replay_counters_summed_over_blocks():
    rep = {
        "capture_s": 2.0,
        "callables": {
            "lm_step": {
                "hits": 10,
                "misses": {"warmup": 1},
                "window_hits": 8,
                "window_misses": {"shape": 1},
                "classes": 1,
                "captured_classes": 1,
            },
        },
    }
    blocks = _blocks([{"eager": _worker(200), "adapter": _worker(20, replay=rep)}] * 2)
    r = M.aggregate(blocks, ["eager", "adapter"])["adapter"]["replay"]
    assert r["blocks"] == 2 and r["window_hits"] == 16 and r["window_misses"] == {"shape": 2}
    assert r["callables"]["lm_step"]["misses"] == {"warmup": 2} and r["capture_s"] == 2.0


def test_counter_delta():
    before = {"f": {"hits": 2, "misses": {"a": 1}}}
    after = {"f": {"hits": 7, "misses": {"a": 1, "b": 3}}, "g": {"hits": 1, "misses": {}}}
    assert M.counter_delta(after, before) == {
        "f": {"hits": 5, "misses": {"b": 3}},
        "g": {"hits": 1, "misses": {}},
    }


def test_cell_env():
    base = {"NO_CUDA_GRAPH": "0", "DUPLEXCADENCE_DISABLE_REPLAY": "1", "X": "y"}
    for c in M.CELLS:
        env = M.cell_env(c, base)
        assert env["NO_TORCH_COMPILE"] == "1" and "DUPLEXCADENCE_DISABLE_REPLAY" not in env
        assert env["X"] == "y"
    assert M.cell_env("eager", base)["NO_CUDA_GRAPH"] == "1"
    assert M.cell_env("adapter", base)["NO_CUDA_GRAPH"] == "1"
    assert "NO_CUDA_GRAPH" not in M.cell_env("vendor", base)


def test_budget():
    now = [0.0]
    b = M.Budget(100.0, clock=lambda: now[0])
    assert b.allows()[0]
    now[0] = 30.0
    b.saw(30.0)
    assert b.allows()[0]  # 70 left >= 30
    now[0] = 75.0
    ok, why = b.allows()
    assert not ok and "slowest worker so far 30 s" in why
    assert M.Budget(None).allows() == (True, "") and M.Budget(None).left() is None


def test_quick_args():
    a = M.parse_args(["--quick"])
    assert (a.device, a.blocks, a.frames, a.warmup, a.profile_frames) == ("cpu", 1, 3, 1, 0)
    assert a.cells == ["eager", "adapter"] and a.tiny and a.threads == 1
    a = M.parse_args(["--quick", "--frames", "5", "--cells", "eager,vendor"])
    assert a.frames == 5 and a.cells == ["eager", "vendor"]
    cmd = M.worker_command("vendor", 2, 7, a)
    assert cmd[cmd.index("--seed") + 1] == "7" and "--tiny" in cmd
    with pytest.raises(SystemExit):
        M.parse_args(["--cells", "eager,nope"])


def test_driver_budget_stop_and_documents(tmp_path, monkeypatch):
    calls = []

    def fake_run(cell, block, seed, args, timeout=None):
        calls.append((block, cell))
        res = _worker(200 if cell == "eager" else 20, busy=10)
        res.update(
            cell=cell,
            block=block,
            seed=seed,
            process_wall_s=40.0,
            torch="x",
            model={"lm_kwargs": "TINY", "lm_params": 1},
        )
        return res

    now = [0.0]

    class FakeBudget(M.Budget):
        def __init__(self, seconds):
            super().__init__(seconds, clock=lambda: now[0])

        def saw(self, wall_s):
            now[0] += wall_s
            super().saw(wall_s)

    monkeypatch.setattr(M, "run_cell_process", fake_run)
    monkeypatch.setattr(M, "Budget", FakeBudget)
    out = tmp_path / "m"
    argv = [
        "--device",
        "cpu",
        "--blocks",
        "2",
        "--cells",
        "eager,adapter",
        "--time-budget",
        "130",
        "--out",
        str(out),
        "--git-commit",
        "abc",
    ]
    args = M.parse_args(argv)
    assert M.driver_main(args, argv) == 0
    # 40 s per worker: 0, 40, 80 fit (left 130, 90, 50 >= 40); at 120 only 10 s are left
    assert calls == [(0, "eager"), (0, "adapter"), (1, "adapter")]
    doc = json.loads(out.with_suffix(".json").read_text())
    assert doc["complete"] is False and doc["budget_stop"]
    assert doc["git_commit"] == "abc" and doc["model"]["lm_kwargs"] == "TINY"
    assert doc["blocks"][1]["order"] == ["adapter", "eager"]
    assert doc["blocks"][1]["results"]["eager"]["status"] == "skipped"
    cells = doc["cells"]
    assert cells["eager"]["status"] == "partial" and cells["adapter"]["status"] == "ok"
    assert cells["adapter"]["exact"] is True and cells["adapter"]["exact_blocks"] == "1/1"
    assert cells["vendor"]["status"] == "not run"
    for key in ("p50_ms", "p95_ms", "busy_ms", "peak_mib", "pcm_sha256", "tokens_sha256", "exact"):
        assert key in cells["adapter"]
    assert cells["adapter"]["speedup_vs_eager"]["geomean"] == pytest.approx(10.0)
    md = out.with_suffix(".md").read_text()
    assert "incomplete run" in md and "--time-budget" in md
    # rerender reproduces the aggregation from the stored blocks
    assert M.rerender(out.with_suffix(".json")) == 0
    again = json.loads(out.with_suffix(".json").read_text())
    assert again["cells"]["adapter"]["exact"] is True


def test_worker_failure_is_one_json_line(monkeypatch, capsys):
    def boom(args, result):
        raise RuntimeError("no bind_adapter")

    monkeypatch.setattr(M, "run_worker", boom)
    args = M.parse_args(["--worker", "--cell", "adapter", "--device", "cpu"])
    assert M.worker_main(args) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.strip()]
    assert len(lines) == 1
    rec = json.loads(lines[0])
    assert (
        rec["status"] == "error" and "no bind_adapter" in rec["error"] and rec["cell"] == "adapter"
    )
