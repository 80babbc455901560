"""bench.token2wav driver bookkeeping: --merge, --missing-only, --time-budget, failure
records, CPU rejection of CUDA-only cells (fake workers: no model, seconds)."""

from __future__ import annotations

import json

import pytest

import bench.token2wav as T
from bench import report, stats


def _ok(cell: str, block: int, p50: float, sha: str, wall: float = 20.0, **kw) -> dict:
    return {
        "status": "ok",
        "cell": cell,
        "block": block,
        "window_ms": [p50 - 1, p50, p50 + 1],
        "split": {},
        "memory": {"process_peak_mib": 100.0, "window_peak_mib": 90.0},
        "pcm_sha256": sha,
        "process_wall_s": wall,
        "determinism_ok": True,
        "hostname": "h1",
        **kw,
    }


class FakeWorkers:
    """Stands in for run_cell_process: p50 by cell, PCM SHA by (cell, block)."""

    def __init__(self, p50: dict, sha=None, wall: float = 20.0, fail: dict | None = None):
        self.p50, self.wall, self.fail = p50, wall, fail or {}
        self.sha = sha or (lambda cell, block: f"sha{block}")
        self.calls: list[tuple[str, int, float, float]] = []

    def __call__(self, cell, block, seed, args, timeout=None, compile_timeout=None):
        self.calls.append((cell, block, timeout, compile_timeout))
        if cell in self.fail:
            return {
                "status": "failed",
                "reason": self.fail[cell],
                "error": self.fail[cell],
                "cell": cell,
                "block": block,
                "seed": seed,
                "process_wall_s": 3.0,
            }
        return _ok(cell, block, self.p50[cell], self.sha(cell, block), wall=self.wall, seed=seed)


def _run(monkeypatch, tmp_path, fake, *argv):
    monkeypatch.setattr(T, "run_cell_process", fake)
    monkeypatch.setattr(T, "_write_reports", lambda doc, out: report.markdown(doc) and None)
    args = T.parse_args(["--device", "cuda", "--out", str(tmp_path / "m"), *argv])
    rc = T.driver_main(args, args._argv)
    doc = json.loads((tmp_path / "m.json").read_text())
    return rc, doc


def test_merge_two_calls_into_one_document(monkeypatch, tmp_path):
    fake1 = FakeWorkers({"B0": 300.0, "S": 290.0, "SRc": 60.0})
    rc, doc1 = _run(monkeypatch, tmp_path, fake1, "--cells", "B0,S,SRc", "--blocks", "2")
    assert rc == 0 and len(fake1.calls) == 6
    assert doc1["cells"]["SRc"]["speedup_vs_B0"]["geomean"] == pytest.approx(5.0)
    assert doc1["cells"]["R"]["status"] == "not run"

    # second call: other cells, B0 not re-run; vendor_rebucket is not bit-exact
    fake2 = FakeWorkers(
        {"R": 150.0, "vendor_rebucket": 100.0},
        sha=lambda c, b: f"sha{b}" if c == "R" else f"other{b}",
    )
    rc, doc = _run(
        monkeypatch, tmp_path, fake2, "--cells", "R,vendor_rebucket", "--blocks", "2", "--merge"
    )
    assert rc == 0 and len(fake2.calls) == 4
    assert doc["settings"]["cells"] == ["B0", "S", "R", "SRc", "vendor_rebucket"]
    assert len(doc["commands"]) == 2 and "--merge" in doc["commands"][1]
    assert [c["index"] for c in doc["calls"]] == [0, 1] and doc["calls"][1]["complete"]
    cells = doc["cells"]
    # first call's cells kept as they were
    assert cells["SRc"]["speedup_vs_B0"]["geomean"] == pytest.approx(5.0)
    assert cells["S"]["exact"] is True
    # paired against B0 of the first call, block by block
    assert cells["R"]["speedup_vs_B0"]["geomean"] == pytest.approx(2.0)
    assert cells["R"]["speedup_vs_B0"]["n"] == 2
    assert cells["R"]["exact"] is True and cells["R"]["counts_as_result"] is True
    assert cells["vendor_rebucket"]["exact"] is False
    assert cells["vendor_rebucket"]["counts_as_result"] is False
    for k in ("p50_ms", "p95_ms", "busy_ms", "peak_mib", "pcm_sha256", "exact"):
        assert k in cells["R"]
    b0 = doc["blocks"][0]
    assert b0["results"]["B0"]["call"] == 0 and b0["results"]["R"]["call"] == 1
    assert [o["call"] for o in b0["orders"]] == [0, 1]
    md = report.markdown(doc)
    assert "2 calls merged" in md and "vendor_rebucket** is not bit-exact" in md
    assert "| vendor_rebucket | **NO** (0/2) |" in md and "† |" in md


def test_merge_replaces_a_rerun_cell_and_keeps_the_old_result(monkeypatch, tmp_path):
    _run(
        monkeypatch,
        tmp_path,
        FakeWorkers({"B0": 300.0, "S": 290.0}),
        "--cells",
        "B0,S",
        "--blocks",
        "1",
    )
    rc, doc = _run(
        monkeypatch, tmp_path, FakeWorkers({"S": 150.0}), "--cells", "S", "--blocks", "1", "--merge"
    )
    blk = doc["blocks"][0]
    assert blk["results"]["S"]["window_ms"][1] == 150.0
    assert blk["replaced"][0]["window_ms"][1] == 290.0
    assert doc["cells"]["S"]["speedup_vs_B0"]["geomean"] == pytest.approx(2.0)


def test_merge_refuses_other_settings(monkeypatch, tmp_path):
    _run(monkeypatch, tmp_path, FakeWorkers({"B0": 300.0}), "--cells", "B0", "--blocks", "1")
    fake = FakeWorkers({"S": 1.0})
    monkeypatch.setattr(T, "run_cell_process", fake)
    args = T.parse_args(
        [
            "--device",
            "cuda",
            "--out",
            str(tmp_path / "m"),
            "--cells",
            "S",
            "--chunks",
            "8",
            "--merge",
        ]
    )
    assert T.driver_main(args, args._argv) == 2 and fake.calls == []


def test_missing_only_fills_what_a_budget_skipped(monkeypatch, tmp_path):
    clock = {"t": 0.0}
    monkeypatch.setattr(T.time, "perf_counter", lambda: clock["t"])

    class Timed(FakeWorkers):
        def __call__(self, *a, **kw):
            clock["t"] += self.wall
            return super().__call__(*a, **kw)

    # budget 100 s, 15 s reserved, 30 s per worker: two workers, then the rest skipped
    fake = Timed({"B0": 300.0, "S": 290.0}, wall=30.0)
    rc, doc = _run(
        monkeypatch, tmp_path, fake, "--cells", "B0,S", "--blocks", "2", "--time-budget", "100"
    )
    assert rc == 0 and len(fake.calls) == 2
    assert fake.calls[1][2] == pytest.approx(100 - 15 - 30)  # timeout = what is left
    b1 = doc["blocks"][1]["results"]
    assert b1["S"]["status"] == "skipped" and "time-budget" in b1["S"]["error"]
    assert doc["cells"]["S"]["status"] == "partial" and doc["cells"]["S"]["blocks_ok"] == "1/2"
    assert len(doc["calls"][0]["skipped"]) == 2
    # then: only the two missing workers run; nothing ok is run again
    fake2 = Timed({"B0": 300.0, "S": 290.0}, wall=30.0)
    rc, doc = _run(
        monkeypatch, tmp_path, fake2, "--cells", "B0,S", "--blocks", "2", "--missing-only"
    )
    assert sorted((c, b) for c, b, *_ in fake2.calls) == [("B0", 1), ("S", 1)]
    assert doc["cells"]["S"]["status"] == "ok" and doc["cells"]["S"]["exact"] is True
    assert "replaced" in doc["blocks"][1]  # the skip records, kept for the audit


def test_a_failed_cell_is_not_launched_again(monkeypatch, tmp_path):
    fake = FakeWorkers({"B0": 300.0}, fail={"SR": "adapter module x is not importable"})
    rc, doc = _run(monkeypatch, tmp_path, fake, "--cells", "B0,SR", "--blocks", "3")
    assert rc == 0 and [c for c, *_ in fake.calls].count("SR") == 1
    sr = doc["cells"]["SR"]
    assert sr["status"] == "failed" and "not importable" in sr["reason"]
    assert [e["status"] for e in sr["errors"]] == ["failed", "skipped", "skipped"]
    md = report.markdown(doc)
    assert "| SR | failed |" in md and "not importable" in md


def test_cuda_only_cells_are_not_launched_on_cpu(monkeypatch, tmp_path):
    fake = FakeWorkers({"B0": 300.0})
    monkeypatch.setattr(T, "run_cell_process", fake)
    monkeypatch.setattr(T, "_write_reports", lambda doc, out: None)
    args = T.parse_args(
        [
            "--device",
            "cpu",
            "--out",
            str(tmp_path / "c"),
            "--blocks",
            "1",
            "--cells",
            "B0,compile_ro,vendor_rebucket,R,Rc,vendor_bucket",
        ]
    )
    assert T.driver_main(args, args._argv) == 0
    assert [c for c, *_ in fake.calls] == ["B0"]
    doc = json.loads((tmp_path / "c.json").read_text())
    for c in ("compile_ro", "vendor_rebucket", "R", "Rc", "vendor_bucket"):
        assert doc["cells"][c]["status"] == "not run" and "needs CUDA" in doc["cells"][c]["reason"]
    args = T.parse_args(["--device", "cpu", "--out", str(tmp_path / "d"), "--cells", "compile_ro"])
    assert T.driver_main(args, args._argv) == 2


def test_estimate_worker_s():
    blocks = [
        {
            "results": {
                "B0": {"process_wall_s": 20.0, "status": "ok"},
                "S": {"process_wall_s": 25.0, "status": "ok"},
                "R": {"process_wall_s": 999.0, "status": "skipped"},
            }
        },
        {"results": {"B0": {"process_wall_s": 22.0, "status": "ok"}}},
    ]
    assert T.estimate_worker_s("B0", blocks) == 22.0
    assert T.estimate_worker_s("SRc", blocks) == 25.0  # unseen: slowest of any cell
    assert T.estimate_worker_s("compile_ro", blocks) == T.FIRST_WORKER_EST_S["compile_ro"]
    assert T.estimate_worker_s("B0", []) is None


def test_merge_helpers():
    prior = {
        "settings": {
            "device": "cuda",
            "chunks": 16,
            "warmup": 3,
            "split_chunks": 4,
            "profile_chunks": 3,
            "seed": 0,
        },
        "blocks": [{"block": 0, "seed": 0, "results": {"B0": {}}}],
    }
    now = dict(prior["settings"])
    assert T.merge_problems(prior, now) == []
    assert T.merge_problems(prior, dict(now, seed=5))  # seeds and settings both differ
    blocks = T.merge_blocks(prior["blocks"], 3, 0)
    assert [b["seed"] for b in blocks] == [0, 1, 2] and "B0" in blocks[0]["results"]
    assert prior["blocks"][0]["results"] == {"B0": {}}  # copied, not shared
    blk = {"results": {"S": {"status": "ok"}}}
    assert T.place_skip(blk, "S", {"status": "skipped"}) is False
    assert blk["results"]["S"]["status"] == "ok"
    assert T.place_skip(blk, "R", {"status": "skipped"}) is True
    T.place_result(blk, "R", {"status": "ok"})
    assert blk["results"]["R"]["status"] == "ok" and blk["replaced"] == [{"status": "skipped"}]


def test_failure_record():
    r = T.failure_record("SR", T.CellFailed("adapter missing", "ImportError: x"), "import")
    assert r["status"] == "failed" and r["reason"] == "adapter missing"
    assert "ImportError" in r["error"]
    r = T.failure_record("compile_ro", RuntimeError("inductor"), "warmup")
    assert r["status"] == "failed" and "warmup" in r["reason"]
    assert T.failure_record("B0", RuntimeError("x"), "window")["status"] == "error"


def test_skipped_cell_status():
    blocks = [
        {
            "block": 0,
            "results": {
                "B0": _ok("B0", 0, 10.0, "a"),
                "X": {"status": "skipped", "error": "budget"},
            },
        }
    ]
    agg = stats.aggregate(blocks, ["B0", "X"])
    assert agg["X"]["status"] == "skipped" and agg["X"]["reason"] == "budget"
    assert agg["B0"]["counts_as_result"] is True


def test_missing_adapter_is_a_failure_record():
    cell = T.Cell("X", "x", True, bind=True, adapter="no_such_adapter_here")
    with pytest.raises(T.CellFailed) as e:
        T._import_adapter(cell)
    assert "not importable" in e.value.reason and "no_such_adapter_here" in e.value.reason


@pytest.mark.slow  # builds the 16-block DiT on the CPU (about a minute)
def test_rebucket_builds_the_vendor_buffers_and_takes_the_graph_branch(monkeypatch):
    """vendor_rebucket's wiring on CPU: torch.cuda.CUDAGraph / torch.cuda.graph replaced by
    stand-ins, each 'graph' replays by running the captured call again on the static
    buffers. The stock DiT.forward_chunk must take its graph branch for 50/56-frame chunks
    (counted), fall back to eager for others, and agree with eager to float tolerance."""
    import contextlib

    torch = pytest.importorskip("torch")
    W = pytest.importorskip("bench.workloads.token2wav")
    if W.unavailable_reason() is not None:
        pytest.skip(W.unavailable_reason())
    m = W.import_stepaudio2()
    torch.manual_seed(0)
    est = m.decoder_dit.DiT(**W.FLOW_CONFIG["estimator"]).eval()
    W._fill_all_zero_params(est, W.ZERO_PARAM_FILL_STD)

    class FakeGraph:
        pass

    monkeypatch.setattr(torch.cuda, "CUDAGraph", FakeGraph)
    monkeypatch.setattr(torch.cuda, "graph", lambda g: contextlib.nullcontext())
    T.rebucket_vendor_graphs(est, {50: 500, 56: 500})
    assert est.use_cuda_graph and sorted(est.graph_chunk) == [50, 56]
    assert est.max_size_chunk == {50: 500, 56: 500}
    ins = est.inference_buffers_chunk[50]["static_inputs"]
    assert [tuple(t.shape) for t in ins] == [
        (2, 320, 50),
        (2, 1, 512),
        (2, 50, 550),
        (16, 2, 1024, 2),
        (16, 2, 8, 500, 128),
    ]

    class Replay:
        def __init__(self, bufs):
            self.b = bufs

        def replay(self):
            i, o = self.b["static_inputs"], self.b["static_outputs"]
            o[0].copy_(est.blocks_forward_chunk(i[0], i[1], i[2], i[3], i[4], o[1], o[2]))

    est.graph_chunk = {k: Replay(v) for k, v in est.inference_buffers_chunk.items()}
    info: dict = {}
    counts = T.count_vendor_graphs(est, info)
    assert info["vendor_buckets"] == [50, 56] and info["vendor_max_size"] == {50: 500, 56: 500}

    g = torch.Generator().manual_seed(1)

    def call(frames: int, cache: int):
        x, mu, cond = (torch.randn(2, 80, frames, generator=g) for _ in range(3))
        t = torch.rand(2, generator=g)
        spks = torch.randn(2, 80, generator=g)
        cnn = torch.randn(16, 2, 1024, 2, generator=g)
        att = torch.randn(16, 2, 8, cache, 128, generator=g)
        with torch.inference_mode():
            est.use_cuda_graph = True
            y, c1, a1 = (v.clone() for v in est.forward_chunk(x, mu, t, spks, cond, cnn, att))
            est.use_cuda_graph = False
            y0, c0, a0 = est.forward_chunk(x, mu, t, spks, cond, cnn, att)
        return (y, c1, a1), (y0, c0, a0)

    graph, eager = call(50, 402)
    assert counts == {"estimator_calls": 2, "bucket_replays": 1}
    for a, b in zip(graph, eager):
        assert a.shape == b.shape
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    call(30, 402)  # no bucket: eager both times
    assert counts == {"estimator_calls": 4, "bucket_replays": 1}
    call(56, 402)
    assert counts["bucket_replays"] == 2
