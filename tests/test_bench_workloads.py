"""The Token2Wav and Moshi benchmark declarations on the harness: the committed H200
results rerender to the committed tables, the cells' environments and flags, and the
vendor-graph control's wiring (slow: builds the real DiT on the CPU)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

pytest.importorskip("pandas", reason="the benchmark harness needs: pip install -e '.[bench]'")

from bench import moshi as M  # noqa: E402
from bench import token2wav as T  # noqa: E402
from bench.harness import document  # noqa: E402
from bench.harness.cli import parse_args  # noqa: E402

RESULTS = Path(__file__).resolve().parents[1] / "bench" / "results"


def _rows(md: str) -> dict[str, list[str]]:
    """{cell: [p50, p95, first speedup]} of a markdown table, whatever its padding."""
    rows = {}
    for line in md.splitlines():
        cols = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cols) > 5 and re.fullmatch(r"[0-9.]+", cols[2]):
            rows[cols[0]] = cols[2:5]
    return rows


@pytest.mark.parametrize("wl,name", [(T.WORKLOAD, "token2wav_h200"), (M.WORKLOAD, "moshi_h200")])
def test_committed_results_rerender_to_the_committed_tables(tmp_path, wl, name):
    shutil.copy(RESULTS / f"{name}.json", tmp_path / f"{name}.json")
    committed = json.loads((RESULTS / f"{name}.json").read_text())
    assert document.rerender(wl, tmp_path / f"{name}.json") == 0
    doc = json.loads((tmp_path / f"{name}.json").read_text())
    for cell, c in committed["cells"].items():
        for k in ("status", "exact", "p50_ms", "p95_ms", "peak_mib", "busy_ms"):
            assert doc["cells"][cell].get(k) == pytest.approx(c.get(k)), (cell, k)
    old, new = _rows((RESULTS / f"{name}.md").read_text()), _rows(
        (tmp_path / f"{name}.md").read_text()
    )
    assert new == old and len(new) >= 3


def test_cell_environments():
    s = document.cell_env(T.WORKLOAD, "S", {"DUPLEXCADENCE_DISABLE_REPLAY": "0"})
    assert s["DUPLEXCADENCE_DISABLE_REPLAY"] == "1"
    assert "DUPLEXCADENCE_DISABLE_REPLAY" not in document.cell_env(
        T.WORKLOAD, "SRc", {"DUPLEXCADENCE_DISABLE_REPLAY": "1"}
    )
    base = {"NO_CUDA_GRAPH": "0", "X": "y"}
    for c in ("eager", "vendor", "adapter"):
        env = document.cell_env(M.WORKLOAD, c, base)
        assert env["NO_TORCH_COMPILE"] == "1" and env["X"] == "y"
    assert document.cell_env(M.WORKLOAD, "adapter", base)["NO_CUDA_GRAPH"] == "1"
    assert "NO_CUDA_GRAPH" not in document.cell_env(M.WORKLOAD, "vendor", base)


def test_flags_of_the_recorded_commands_still_parse():
    for call in json.loads((RESULTS / "token2wav_h200.json").read_text())["calls"]:
        argv = call["command"].split()[3:]
        a = parse_args(T.WORKLOAD, argv)
        assert a.chunks == 16 and a.warmup == 3 and a.blocks == 4
    for call in json.loads((RESULTS / "moshi_h200.json").read_text())["calls"]:
        a = parse_args(M.WORKLOAD, call["command"].split()[3:])
        assert a.frames == 1000 and a.profile_frames == 3 and a.blocks == 1
    q = parse_args(M.WORKLOAD, ["--quick"])
    assert (q.device, q.tiny, q.frames, q.cells) == ("cpu", True, 3, ["eager", "adapter"])
    q = parse_args(T.WORKLOAD, ["--quick", "--chunks", "3"])
    assert q.cells == ["B0", "S"] and q.chunks == 3 and q.split_chunks == 1


def test_missing_adapter_is_a_failure():
    cell = T.T2WCell("X", "x", bind=True, adapter="no_such_adapter_here")
    with pytest.raises(T.CellFailed, match="not importable"):
        T.import_adapter(cell)


@pytest.mark.slow  # builds the 16-block DiT on the CPU (about a minute)
def test_rebucket_builds_the_vendor_buffers_and_takes_the_graph_branch(monkeypatch):
    """vendor_rebucket's wiring on CPU: torch.cuda.CUDAGraph / torch.cuda.graph replaced by
    stand-ins, each 'graph' replays by running the captured call again on the static
    buffers. The stock DiT.forward_chunk must take its graph branch for 50/56-frame chunks
    (counted), fall back to eager for others, and agree with eager to float tolerance."""
    import contextlib

    from bench.workloads import unavailable_reason

    if unavailable_reason("token2wav") is not None:
        pytest.skip(unavailable_reason("token2wav"))
    import torch

    from bench.workloads import token2wav as W

    m = W.import_stepaudio2()
    torch.manual_seed(0)
    est = m.decoder_dit.DiT(**W.FLOW_CONFIG["estimator"]).eval()
    W._fill_all_zero_params(est, W.ZERO_PARAM_FILL_STD)
    monkeypatch.setattr(torch.cuda, "CUDAGraph", lambda: None)
    monkeypatch.setattr(torch.cuda, "graph", lambda g: contextlib.nullcontext())
    T.rebucket_vendor_graphs(est, {50: 500, 56: 500})
    assert est.use_cuda_graph and sorted(est.graph_chunk) == [50, 56]
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
            o[0].copy_(est.blocks_forward_chunk(*i, o[1], o[2]))

    est.graph_chunk = {k: Replay(v) for k, v in est.inference_buffers_chunk.items()}
    info: dict = {}
    counts = T.count_vendor_graphs(est, info)
    assert info["vendor_buckets"] == [50, 56] and info["vendor_max_size"] == {50: 500, 56: 500}
    g = torch.Generator().manual_seed(1)

    def call(frames: int, cache: int):
        x, mu, cond = (torch.randn(2, 80, frames, generator=g) for _ in range(3))
        t, spks = torch.rand(2, generator=g), torch.randn(2, 80, generator=g)
        cnn, att = torch.randn(16, 2, 1024, 2, generator=g), torch.randn(
            16, 2, 8, cache, 128, generator=g
        )
        with torch.inference_mode():
            est.use_cuda_graph = True
            graph = [v.clone() for v in est.forward_chunk(x, mu, t, spks, cond, cnn, att)]
            est.use_cuda_graph = False
            eager = est.forward_chunk(x, mu, t, spks, cond, cnn, att)
        for a, b in zip(graph, eager):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)

    call(50, 402)
    assert counts == {"estimator_calls": 2, "bucket_replays": 1}
    call(30, 402)  # no bucket: eager both times
    assert counts == {"estimator_calls": 4, "bucket_replays": 1}
    call(56, 402)
    assert counts["bucket_replays"] == 2
