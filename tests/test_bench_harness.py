"""bench/harness on the tiny fake workload (tests/fake_workload.py) and on synthetic
worker records: statistics, exactness, the worker's phases and hashes, the driver's
bookkeeping (--merge, --missing-only, --time-budget, failures, CPU-only runs), the
report, --rerender, and one real run of worker processes. Seconds on a CPU."""

from __future__ import annotations

import json
import math
import types

import pytest

pytest.importorskip("pandas", reason="the benchmark harness needs: pip install -e '.[bench]'")
scipy_stats = pytest.importorskip("scipy.stats", reason="pip install -e '.[bench]'")

import fake_workload  # noqa: E402

from bench.harness import driver, document, report, stats, worker  # noqa: E402
from bench.harness.cli import parse_args  # noqa: E402
from bench.harness.profile import summarize_trace  # noqa: E402

WL = fake_workload.WORKLOAD


def _ok(p50: float, out: str = "o", argmax: str = "a", wall: float = 20.0, **kw) -> dict:
    return {
        "status": "ok",
        "window_ms": [p50 - 2, p50 - 1, p50, p50 + 1, p50 + 10],
        "memory": {"process_peak_mib": 100.0, "window_peak_mib": 90.0},
        "out_sha256": out,
        "argmax_sha256": argmax,
        "step_out_sha256": [out + "0", out + "1"],
        "step_argmax_sha256": [argmax + "0", argmax + "1"],
        "process_wall_s": wall,
        "determinism_ok": True,
        "hostname": "h1",
        **kw,
    }


def _blocks(*rows: dict) -> list[dict]:
    return [{"block": b, "seed": b, "results": dict(r)} for b, r in enumerate(rows)]


# ------------------------------------------------------------------------ statistics
def test_paired_ratio_matches_scipy_t_interval():
    num, den = [1.0, 2.0, 4.0, None, 0.0], [1.0, 1.0, 1.0, 1.0, 1.0]
    r = stats.paired_ratio(num, den)  # the missing and the non-positive pair are dropped
    logs = [math.log(x) for x in (1.0, 2.0, 4.0)]
    lo, hi = scipy_stats.t.interval(0.95, 2, loc=sum(logs) / 3, scale=scipy_stats.sem(logs))
    assert r["n"] == 3 and r["geomean"] == pytest.approx(2.0)
    assert r["ci95"] == pytest.approx([math.exp(lo), math.exp(hi)])
    assert stats.paired_ratio([2, 4], [1, 2])["ci95"] == pytest.approx([2.0, 2.0])
    one = stats.paired_ratio([3.0], [1.0])
    assert one["ci95"] is None and "one block" in one["ci_method"]
    assert stats.paired_ratio([None], [1.0]) is None


def test_aggregate_exactness_ratios_and_failures():
    blocks = _blocks(
        {"stock": _ok(300.0), "same": _ok(60.0), "noisy": _ok(100.0, out="x")},
        {"stock": _ok(310.0), "same": _ok(62.0), "noisy": {"status": "crash", "error": "-9"}},
    )
    agg = stats.aggregate(WL, blocks, ["stock", "same", "noisy"])
    stock, same, noisy = agg["stock"], agg["same"], agg["noisy"]
    assert stock["exact"] and stock["exact_note"] == "reference"
    assert stock["p50_ms"] == pytest.approx(305.0)  # median over blocks of block medians
    assert same["exact"] and same["exact_blocks"] == "2/2" and same["counts_as_result"]
    assert same["speedup_vs_stock"]["geomean"] == pytest.approx(5.0)
    assert same["p50_ratio_vs_stock"]["geomean"] == pytest.approx(0.2)
    # a crash where the reference ran counts against exactness; the divergence is located
    assert noisy["status"] == "partial" and noisy["exact_blocks"] == "0/2"
    assert noisy["first_divergence"] == [{"block": 0, "what": "out", "step": 0}]
    assert noisy["errors"][0]["block"] == 1 and noisy["reason"] == "-9"
    assert not noisy["counts_as_result"]


def test_exactness_needs_every_stream_and_skips_blocks_without_reference():
    blocks = _blocks(
        {"stock": _ok(10.0), "same": _ok(5.0, argmax="b")},
        {"stock": {"status": "skipped"}, "same": _ok(5.0)},
    )
    same = stats.aggregate(WL, blocks, ["stock", "same"])["same"]
    assert same["exact"] is False and same["exact_blocks"] == "0/1"
    assert "1 block(s) without a stock result" in same["exact_note"]
    only = stats.aggregate(WL, _blocks({"same": _ok(5.0)}), ["same"])["same"]
    assert only["exact"] is False and only["exact_blocks"] == "0/0"
    skipped = stats.aggregate(WL, _blocks({"stock": {"status": "skipped"}}), ["stock"])["stock"]
    assert skipped["status"] == "skipped"


def test_summarize_trace_counts_and_attribution():
    ev = [
        {"ph": "X", "cat": "user_annotation", "name": "bench::layer", "ts": 0, "dur": 50},
        {"ph": "X", "cat": "kernel", "name": "k1", "ts": 10, "dur": 20},
        {"ph": "X", "cat": "kernel", "name": "k2", "ts": 70, "dur": 10},
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy", "ts": 96, "dur": 2},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 9, "dur": 1},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "ts": 69, "dur": 1},
        {"ph": "i", "cat": "kernel", "name": "instant", "ts": 1},
    ]
    s = summarize_trace(ev, 2, "step", ("layer",))
    assert s["busy_ms"] == pytest.approx(30 / 1e3 / 2) and s["kernels_per_step"] == 1.0
    assert s["kernel_launch_calls_per_step"] == 0.5 and s["graph_launch_calls_per_step"] == 0.5
    assert s["layer_busy_ms"] == pytest.approx(20 / 1e3 / 2)
    assert s["other_busy_ms"] == pytest.approx(10 / 1e3 / 2)


# ------------------------------------------------------------------------ the worker
def _worker_args(cell: str, **kw):
    return parse_args(
        WL,
        [
            "--worker",
            "--cell",
            cell,
            "--device",
            "cpu",
            "--split-steps",
            "2",
            *[x for k, v in kw.items() for x in (f"--{k}", str(v))],
        ],
    )


def test_worker_phases_hashes_and_envelope(capsys):
    res = worker.worker_main(WL, _worker_args("stock", steps=4))
    line = [x for x in capsys.readouterr().out.splitlines() if x.strip()]
    assert len(line) == 1 and json.loads(line[0])["status"] == "ok" == res["status"]
    assert len(res["window_ms"]) == 4 and len(res["warmup_ms"]) == 1
    n = 1 + 4 + 2 + 0 + 1  # warmup, window, split, profile, final
    assert res["n_steps_streamed"] == n and len(res["step_out_sha256"]) == n
    assert res["n_out"] == 4 * n and len(res["argmax_values"]) == n
    assert len(res["split"]["layer_ms"]) == 2 and len(res["split"]["other_ms"]) == 2
    assert res["phases_seen"] == ["build", "setup", "warmup", "window"] and res["finished"]
    assert res["determinism_ok"] and res["determinism"]["cudnn_deterministic"] is True
    assert worker.ENVELOPE == {"cudnn_deterministic": True, "cudnn_benchmark": False}
    again = worker.worker_main(WL, _worker_args("same", steps=4))
    assert again["out_sha256"] == res["out_sha256"]
    noisy = worker.worker_main(WL, _worker_args("noisy", steps=4))
    assert noisy["out_sha256"] != res["out_sha256"]
    assert noisy["argmax_sha256"] == res["argmax_sha256"]


def test_worker_failures_are_records():
    boom = worker.worker_main(WL, _worker_args("boom"))
    assert boom["status"] == "failed" and boom["failed_phase"] == "setup"
    assert "the fake set-up raised" in boom["reason"] and "boom set-up" in boom["error"]
    gpu = worker.worker_main(WL, _worker_args("gpu"))
    assert gpu["status"] == "failed" and "needs CUDA" in gpu["reason"]


# ------------------------------------------------------------------------ the driver
class FakeWorkers:
    """Stands in for run_cell_process; every worker takes ``wall`` s of a fake clock."""

    def __init__(self, p50: dict, clock: list, wall: float = 30.0, out=None, fail=()):
        self.p50, self.clock, self.wall, self.fail = p50, clock, wall, fail
        self.out = out or (lambda cell, block: f"o{block}")
        self.calls: list[tuple] = []

    def __call__(self, wl, args, cell, block, seed, timeout):
        self.calls.append((cell, block, timeout))
        self.clock[0] += self.wall
        if cell in self.fail:
            return {
                "status": "failed",
                "reason": "no adapter",
                "error": "no adapter",
                "process_wall_s": 3.0,
            }
        return _ok(self.p50[cell], out=self.out(cell, block), wall=self.wall, seed=seed)


def _drive(monkeypatch, tmp_path, fake, *argv):
    monkeypatch.setattr(driver, "run_cell_process", fake)
    monkeypatch.setattr(driver.time, "perf_counter", lambda: fake.clock[0])
    monkeypatch.setattr(document, "write_reports", lambda wl, doc, out: report.markdown(wl, doc))
    args = parse_args(WL, ["--device", "cpu", "--out", str(tmp_path / "m"), *argv])
    rc = driver.drive(WL, args)
    return rc, json.loads((tmp_path / "m.json").read_text())


def test_merge_pairs_calls_by_block_and_keeps_what_it_replaces(monkeypatch, tmp_path):
    clock = [0.0]
    fake = FakeWorkers({"stock": 300.0, "same": 60.0}, clock)
    rc, doc = _drive(monkeypatch, tmp_path, fake, "--cells", "stock,same", "--blocks", "2")
    assert rc == 0 and len(fake.calls) == 6  # the reference twice per block
    assert doc["reference_reproducible"] is True
    assert doc["cells"]["noisy"]["status"] == "not run"
    assert doc["blocks"][1]["order"] == ["same", "stock"]  # rotated by the block index
    fake2 = FakeWorkers(
        {"noisy": 150.0, "same": 30.0}, clock, out=lambda c, b: f"n{b}" if c == "noisy" else f"o{b}"
    )
    rc, doc = _drive(
        monkeypatch, tmp_path, fake2, "--cells", "noisy,same", "--blocks", "2", "--merge"
    )
    assert rc == 0 and len(fake2.calls) == 4 and [c["index"] for c in doc["calls"]] == [0, 1]
    cells = doc["cells"]
    assert doc["settings"]["cells"] == ["stock", "same", "noisy"]
    assert cells["noisy"]["speedup_vs_stock"]["geomean"] == pytest.approx(2.0)  # first call's stock
    assert cells["noisy"]["exact"] is False and cells["same"]["exact"] is True
    assert cells["same"]["speedup_vs_stock"]["geomean"] == pytest.approx(10.0)  # re-run replaced
    assert doc["blocks"][0]["replaced"][0]["window_ms"][2] == 60.0
    assert "2 calls merged" in report.markdown(WL, doc)
    args = parse_args(
        WL, ["--device", "cpu", "--out", str(tmp_path / "m"), "--steps", "9", "--merge"]
    )
    assert driver.drive(WL, args) == 2  # other step counts: refused


def test_time_budget_then_missing_only(monkeypatch, tmp_path):
    clock = [0.0]
    fake = FakeWorkers({"stock": 300.0, "same": 290.0}, clock, wall=30.0)
    # 100 s, 15 s kept for reports, 30 s per worker: two run, the rest is skipped
    rc, doc = _drive(
        monkeypatch,
        tmp_path,
        fake,
        "--cells",
        "stock,same",
        "--blocks",
        "2",
        "--time-budget",
        "100",
        "--no-reference-repeat",
    )
    assert [c[:2] for c in fake.calls] == [("stock", 0), ("same", 0)]
    assert fake.calls[1][2] == pytest.approx(100 - 15 - 30)  # timeout = what is left
    assert doc["cells"]["same"]["status"] == "partial" and "time-budget" in doc["budget_stop"]
    fake2 = FakeWorkers({"stock": 300.0, "same": 290.0}, clock)
    rc, doc = _drive(
        monkeypatch,
        tmp_path,
        fake2,
        "--cells",
        "stock,same",
        "--blocks",
        "2",
        "--missing-only",
        "--no-reference-repeat",
    )
    assert sorted(c[:2] for c in fake2.calls) == [("same", 1), ("stock", 1)]
    assert doc["cells"]["same"]["status"] == "ok" and "replaced" in doc["blocks"][1]


def test_the_reference_runs_twice_and_nothing_is_exact_against_one_that_moves(
    monkeypatch, tmp_path
):
    clock, runs = [0.0], {}

    def out(cell: str, block: int) -> str:  # block 1's reference answers otherwise again
        runs[(cell, block)] = runs.get((cell, block), 0) + 1
        return "moved" if (cell, block, runs[(cell, block)]) == ("stock", 1, 2) else f"o{block}"

    fake = FakeWorkers({"stock": 300.0, "same": 60.0}, clock, out=out)
    rc, doc = _drive(monkeypatch, tmp_path, fake, "--cells", "stock,same", "--blocks", "2")
    assert [c[:2] for c in fake.calls] == [
        ("stock", 0), ("stock", 0), ("same", 0), ("same", 1), ("stock", 1), ("stock", 1)
    ]  # fmt: skip
    check = doc["reference_check"]
    assert doc["reference_reproducible"] is False and check["blocks_checked"] == 2
    assert [b["reproducible"] for b in check["per_block"]] == [True, False]
    assert check["per_block"][1]["divergence"] == {"what": "out", "step": 0}
    same = doc["cells"]["same"]
    assert same["exact_blocks"] == "1/1" and "did not reproduce itself" in same["exact_note"]
    assert same["exact"] is False and not same["counts_as_result"]
    assert "reproducible: **NO**" in report.markdown(WL, doc)
    # unchecked without the second run
    rc, doc = _drive(monkeypatch, tmp_path, FakeWorkers({"stock": 3.0}, clock), "--cells",
                     "stock", "--no-reference-repeat")  # fmt: skip
    assert doc["reference_reproducible"] is None and "**unchecked**" in report.markdown(WL, doc)


def test_failed_cell_not_relaunched_and_cuda_cells_not_run_on_cpu(monkeypatch, tmp_path):
    fake = FakeWorkers({"stock": 10.0}, [0.0], fail=("boom",))
    rc, doc = _drive(monkeypatch, tmp_path, fake, "--cells", "stock,boom,gpu", "--blocks", "3")
    assert [c for c, *_ in fake.calls].count("boom") == 1 and "gpu" not in [
        c for c, *_ in fake.calls
    ]
    boom = doc["cells"]["boom"]
    assert boom["status"] == "failed" and [e["status"] for e in boom["errors"]] == [
        "failed",
        "skipped",
        "skipped",
    ]
    assert (
        doc["cells"]["gpu"]["status"] == "not run" and "needs CUDA" in doc["cells"]["gpu"]["reason"]
    )
    assert doc["budget_stop"] is None
    md = report.markdown(WL, doc)
    assert "| boom   | failed" in md and "**gpu** (not run)" in md


def test_estimate_and_worker_command():
    blocks = [
        {
            "results": {
                "stock": {"process_wall_s": 20.0},
                "x": {"process_wall_s": 9.0, "status": "skipped"},
            }
        }
    ]
    assert driver.estimate_worker_s("stock", blocks) == 20.0
    assert driver.estimate_worker_s("same", blocks) == 20.0  # unseen: slowest of any cell
    assert driver.estimate_worker_s("boom", blocks, WL.first_worker_est_s) == 20.0
    assert driver.estimate_worker_s("boom", [], WL.first_worker_est_s) == 5.0
    assert driver.estimate_worker_s("stock", []) is None
    args = parse_args(WL, ["--device", "cpu", "--threads", "1"])
    cmd = driver.worker_command(WL, args, "same", 2, 7, 33.4)
    assert cmd[cmd.index("--seed") + 1] == "7" and cmd[cmd.index("--worker-timeout") + 1] == "33"
    assert cmd[cmd.index("--steps") + 1] == "3" and cmd[cmd.index("--threads") + 1] == "1"


def test_cell_env_and_quick():
    wl = types.SimpleNamespace(
        base_env={"A": "1"}, cell=lambda c: types.SimpleNamespace(env={"B": None})
    )
    env = document.cell_env(wl, "x", {"DUPLEXCADENCE_DISABLE_REPLAY": "1", "B": "2", "C": "3"})
    assert env == {"A": "1", "C": "3"}
    q = parse_args(WL, ["--quick", "--blocks", "2"])
    assert q.device == "cpu" and q.blocks == 2 and q.steps == 3
    with pytest.raises(SystemExit):
        parse_args(WL, ["--cells", "stock,nope"])


# ------------------------------------------------------------- a real run, rerendered
@pytest.fixture(scope="module")
def real_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("run") / "fake"
    argv = [
        "--device",
        "cpu",
        "--blocks",
        "1",
        "--cells",
        "stock,same,noisy",
        "--threads",
        "1",
        "--quiet-workers",
        "--out",
        str(out),
    ]
    assert driver.drive(WL, parse_args(WL, argv)) == 0
    return out


def test_real_worker_processes(real_run):
    doc = json.loads(real_run.with_suffix(".json").read_text())
    cells = doc["cells"]
    assert cells["same"]["exact"] and not cells["noisy"]["exact"]
    assert doc["complete"] and doc["git_commit"] and doc["torch"] and doc["gpu"] == "cpu"
    assert doc["determinism"]["held_in_every_worker"] is True
    assert doc["blocks"][0]["results"]["stock"]["finished"] is True
    assert real_run.with_suffix(".png").stat().st_size > 1000
    assert "| same   | yes" in real_run.with_suffix(".md").read_text()


def test_rerender_reproduces_the_tables(real_run):
    md = real_run.with_suffix(".md").read_text()
    doc = json.loads(real_run.with_suffix(".json").read_text())
    for c in doc["cells"].values():  # drop every aggregate: rerender recomputes them
        for k in [k for k in c if k not in ("what", "status", "reason")]:
            del c[k]
    real_run.with_suffix(".json").write_text(json.dumps(doc))
    assert document.rerender(WL, real_run.with_suffix(".json")) == 0
    assert real_run.with_suffix(".md").read_text() == md


def test_memory_by_pool_puts_each_graph_pool_apart():
    import torch

    from bench.harness.worker import MemTracker

    tracker = MemTracker(torch.device("cpu"))
    assert tracker.by_pool() is None  # no allocator to read on a CPU

    class Allocator:  # torch.cuda's two calls, with segments of two devices
        def current_device(self):
            return 0

        def memory_snapshot(self):
            mib = 2**20
            return [
                {
                    "device": 0,
                    "segment_pool_id": (0, 0),
                    "total_size": 4 * mib,
                    "allocated_size": mib,
                },
                {
                    "device": 0,
                    "segment_pool_id": (1, 3),
                    "total_size": 6 * mib,
                    "allocated_size": 0,
                },
                {
                    "device": 0,
                    "segment_pool_id": (1, 3),
                    "total_size": 4 * mib,
                    "allocated_size": 6 * mib,
                },
                {
                    "device": 1,
                    "segment_pool_id": (0, 0),
                    "total_size": 99 * mib,
                    "allocated_size": 0,
                },
            ]

    tracker.cuda, tracker.device = Allocator(), torch.device("cuda")
    assert tracker.by_pool() == {
        "graph pool 1.3": {"reserved_mib": 10.0, "allocated_mib": 6.0},
        "default": {"reserved_mib": 4.0, "allocated_mib": 1.0},
    }


def test_an_out_path_with_a_dot_keeps_its_name(tmp_path):
    """``--out`` has no suffix of its own: ``eps0.5`` and ``eps0.0`` are two documents
    (Path.with_suffix made both ``eps0.json`` and the second run overwrote the first)."""
    assert document.artefact(tmp_path / "as2d_eps0.5", ".json").name == "as2d_eps0.5.json"
    assert document.artefact(str(tmp_path / "m"), ".md") == tmp_path / "m.md"
    names = {document.artefact(tmp_path / f"eps{e}", ".png").name for e in ("0.0", "0.5")}
    assert names == {"eps0.0.png", "eps0.5.png"}
