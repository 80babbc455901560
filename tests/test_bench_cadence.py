"""The paced cadence harness (bench/cadence) on the CPU with the fake session workload
(tests/fake_sessions.py): the seeded trace, paced clients against the clock, the run
order and budget, the metrics and the per-arm summary, and one small sweep of real
worker processes (both shapes, solo references, exactness per session)."""

from __future__ import annotations

import json
import threading

import pytest

pytest.importorskip("pandas", reason="the benchmark harness needs: pip install -e '.[bench]'")

import fake_sessions  # noqa: E402
import torch  # noqa: E402

from bench.cadence import Arm, TraceSettings, cli, session, summary, sweep, trace  # noqa: E402
from bench.cadence.serve import Client  # noqa: E402

FAST = TraceSettings(
    seed=3,
    duration_s=0.8,
    period_s=0.05,
    ramp_s=0.2,
    turn_chunks=(2, 5),
    silence_s=(0.05, 0.1),
    p_reset=1.0,
)


def test_trace_is_seeded_per_session_and_paced():
    s = TraceSettings(seed=1, duration_s=60.0)
    assert trace(s, 3)[2] == trace(s, 40)[2] == session(s, 2)  # independent of N
    assert session(s, 2) != session(TraceSettings(seed=2, duration_s=60.0), 2)
    for spec in trace(s, 8):
        c = spec.chunks
        assert c[0].arrival_s == pytest.approx(spec.arrival_s + s.period_s) and c[0].turn == 0
        assert [x.seq for x in c] == list(range(len(c))) and c[-1].arrival_s < s.duration_s
        for a, b in zip(c, c[1:]):
            if b.turn == a.turn:
                assert b.arrival_s - a.arrival_s == pytest.approx(s.period_s) and b.k == a.k + 1
            else:  # a silence, then a new turn whose first packet may reset
                assert b.k == 0 and b.arrival_s - a.arrival_s > s.period_s
        assert not any(x.reset for x in c if x.k or x.turn == 0)
    assert any(x.reset for spec in trace(s, 8) for x in spec.chunks)


def _serve(specs, paced: bool) -> list[Client]:
    server = fake_sessions.Server(fake_sessions.SESSIONS.arm("stock_inproc"), torch.device("cpu"))
    clients = [Client(server, spec, fake_sessions.SESSIONS.streams, t0=0.0) for spec in specs]
    if paced:
        import time

        for c in clients:
            c.t0 = time.perf_counter()
        threads = [threading.Thread(target=c.serve) for c in clients]
        [t.start() for t in threads]
        [t.join() for t in threads]
    else:
        [c.serve(paced=False) for c in clients]
    return clients


def test_paced_clients_keep_time_and_bytes():
    specs = trace(FAST, 3)
    paced, alone = _serve(specs, paced=True), _serve(specs, paced=False)
    for p, a, spec in zip(paced, alone, specs):
        assert p.error is None and len(p.rows) == len(spec.chunks)
        assert [r[3] for r in p.rows] == [c.arrival_s for c in spec.chunks]
        assert all(r[4] >= 0 for r in p.rows) and p.open_ms is not None
        assert p.hashes.record() == a.hashes.record()  # interleaving changes no byte


def test_the_peak_is_the_servers_where_its_memory_lives_elsewhere():
    from bench.cadence.serve import run_peak_mib

    class RayLike:  # replicas in other processes: the worker's own counters read 0
        def peak_mib(self):
            return 512.0

    assert run_peak_mib(RayLike(), torch.device("cpu")) == 512.0
    assert run_peak_mib(object(), torch.device("cpu")) is None


def test_order_puts_the_headline_first():
    plan = sweep.order({"a": [1, 4, 16, 24, 32], "b": [8, 16, 36]})
    assert plan[:2] == [("a", 16), ("b", 16)]
    assert plan[2:5] == [("a", 24), ("b", 36), ("a", 32)]
    assert plan[5:] == [("a", 4), ("b", 8), ("a", 1)]


def test_metrics_and_arm_summary():
    worker = {
        "chunks": {"k": [0, 1, 2, 0], "latency_ms": [900.0, 50.0, 1200.0, 20.0]},
        "peak_mib": 1024.0,
        "hashes": {"0": {"pcm_sha256": "a"}, "1": {"pcm_sha256": "b"}, "7": {"pcm_sha256": "c"}},
    }
    m = summary.run_metrics([worker, worker], 1000.0, 0.5)
    assert m["chunks"] == 8 and m["misses"] == 2 and m["turns"] == 4
    assert m["peak_gib"] == 2.0 and m["gpu_busy_share"] == 0.5 and m["max_ms"] == 1200.0
    crashed = summary.run_metrics([{"status": "crash"}], 1000.0, None)
    assert crashed["chunks"] == 0 and crashed["p95_ms"] is None and crashed["peak_gib"] is None
    ex = summary.exactness(
        [worker], {"0": {"pcm_sha256": "a"}, "1": {"pcm_sha256": "x"}}, ["pcm_sha256"]
    )
    assert ex == {"sessions_hashed": 2, "sessions_exact": 1, "sessions_differing": [1]}
    points = {
        8: {"status": "ok", "misses": 0, "p95_ms": 80.0, "peak_gib": 3.0, **ex},
        16: {
            "status": "ok",
            "misses": 0,
            "p95_ms": 120.0,
            "peak_gib": 5.0,
            "sessions_hashed": 2,
            "sessions_exact": 2,
        },
        24: {"status": "ok", "misses": 3, "p95_ms": 1500.0, "peak_gib": 7.0},
        32: {"status": "failed"},
    }
    points[24]["max_lane_wait_ms"] = 350.0  # the largest N that ran
    for p in points.values():
        p["run_s"] = 61.0
    a = summary.arm_summary(points, 60.0)
    assert a == {
        "max_sessions_at_cadence": 16,
        "p95_ms_at_16": 120.0,
        "max_lane_wait_ms_at_max_n": 350.0,
        "peak_gib_at_max": 5.0,
        "all_sessions_exact": False,
        "sessions_hashed": 4,
    }
    points[16]["run_s"] = 30.0  # too short a run to claim N = 16; 8 still holds
    assert summary.arm_summary(points, 60.0)["max_sessions_at_cadence"] == 8


def test_budget_skips_what_does_not_fit(monkeypatch, tmp_path):
    launched = []

    def fake_launch(wl, args, arm, groups, unpaced, limit_s=None):
        launched.append((arm, len(groups), unpaced))
        return [
            {
                "status": "ok",
                "setup_s": 1.0,
                "chunks": {"k": [0] * len(g), "latency_ms": [10.0] * len(g)},
                "peak_mib": None,
                "hashes": {str(i): {"pcm_sha256": "h"} for i in g},
            }
            for g in groups
        ]

    monkeypatch.setattr(sweep, "launch", fake_launch)
    clock = [0.0]
    monkeypatch.setattr(sweep.time, "perf_counter", lambda: clock[0])
    args = cli.parse_args(
        [
            "--workload",
            "tests.fake_sessions",
            "--arms",
            "stock_inproc",
            "--n",
            "4,16,24",
            "--duration",
            "60",
            "--time-budget",
            "100",
            "--references",
            "1",
            "--setup-estimate",
            "10",
            "--out",
            str(tmp_path / "s"),
        ]
    )
    args.arm_n = {"stock_inproc": [4, 16, 24]}
    run = sweep.Sweep(fake_sessions.SESSIONS, args, None, sweep.GpuSampler(99))
    orig = run.run

    def timed_run(arm, n):
        clock[0] += 61.0
        return orig(arm, n)

    run.run = timed_run
    run.sweep()
    # the reference and its second solo run (is it reproducible?) together, then what fits
    assert launched == [("stock_procs", 2, True), ("stock_inproc", 1, False)]
    assert [(s["arm"], s["n"]) for s in run.skipped] == [("stock_inproc", 24), ("stock_inproc", 4)]
    doc = run.write(complete=True)
    assert doc["reference_reproducible"] is True
    check = doc["workloads"]["fake_sessions"]["reference_check"]
    assert check["sessions"] == {"0": {"status": "ok", "reproducible": True}}
    assert doc["arms"]["stock_inproc"]["reference_reproducible"] is True
    assert doc["arms"]["stock_inproc"]["all_sessions_exact"] is True
    assert doc["arms"]["stock_inproc"]["p95_ms_at_16"] == 10.0 and doc["gpu"] is None


def test_pool_counters_come_from_the_servers_stats():
    server = {
        "sessions": {
            "max_lane_wait_s": 0.25,
            "lane_capture": [{"lane": 0, "seconds": 2.5}, {"lane": 1, "seconds": 1.0}],
            "affinity_hits": 90, "affinity_misses": 10, "eager_steps": 10,
            "background_captures": 4, "background_capture_s": 6.0, "capture_errors": 0,
        },
        "params": {"evictions": 2, "regrows": 8},
    }  # fmt: skip
    c = summary.pool_counters([{"server": server}, {"server": {}}])
    assert c["max_lane_wait_ms"] == 250.0 and c["capture_s_at_bind"] == 2.5
    assert (c["affinity_hits"], c["eager_steps"], c["evictions"]) == (90, 10, 2)
    assert summary.pool_counters([{"server": {}}]) == {}  # a stock arm: nothing to say


def test_a_lockstep_arms_audit_counters_are_summed_over_its_workers():
    tick = {"ticks": 10, "width": 8, "rows": 80, "tick_s": 0.5}
    audit = {"followed": 1, "checks": 9, "divergences": 0, "stopped_behind": 1, "shadow_errors": 1}
    c = summary.pool_counters([{"server": {"lockstep": {**tick, "audit": audit}}}] * 2)
    assert (c["audit_followed"], c["audit_checks"], c["audit_stopped"]) == (2, 18, 4)
    assert c["audit_divergences"] == 0 and c["ticks"] == 20
    assert "audit_checks" not in summary.pool_counters([{"server": {"lockstep": tick}}])
    doc = {"arms": {"b8": {}}, "per_n": {"b8": {"8": {"status": "ok", **c}}}, "workload": "m"}
    doc.update(command="c", settings={})
    assert "- audit: b8 N=8: a batch-1 shadow followed 2 sessions and checked 18 frames" in (
        summary.markdown(doc)
    )


def ok_worker(group: list, hashes: dict) -> dict:
    """A worker's result for ``group`` whose sessions all answer ``hashes``."""
    return {
        "status": "ok",
        "setup_s": 1.0,
        "chunks": {"k": [0] * len(group), "latency_ms": [10.0] * len(group)},
        "peak_mib": None,
        "hashes": {str(i): dict(hashes) for i in group},
    }


def fake_sweep(monkeypatch, tmp_path, run_group, n: int, *flags: str) -> dict:
    """A sweep of stock_inproc at ``n`` sessions whose worker processes are
    ``run_group(group, again)`` (``again``: the group's sessions already ran in this
    launch, a reference's second solo run); its document."""

    def fake_launch(wl, args, arm, groups, unpaced, limit_s=None):
        seen: set = set()
        results = []
        for g in groups:
            results.append(run_group(g, bool(seen & set(g))))
            seen.update(g)
        return results

    monkeypatch.setattr(sweep, "launch", fake_launch)
    args = cli.parse_args(
        ["--workload", "tests.fake_sessions", "--arms", "stock_inproc", "--n", str(n),
         "--duration", "1", *flags, "--out", str(tmp_path / "s")]
    )  # fmt: skip
    args.arm_n = {"stock_inproc": [n]}
    run = sweep.Sweep(fake_sessions.SESSIONS, args, None, sweep.GpuSampler(99))
    run.sweep()
    return run.write(complete=True)


def test_sessions_are_no_result_against_references_that_move(monkeypatch, tmp_path):
    """A second solo run of a session that answers other bytes: the references move,
    so no arm's sessions count as exact."""
    doc = fake_sweep(
        monkeypatch,
        tmp_path,
        lambda g, again: ok_worker(g, {"pcm_sha256": "moved" if again else "h"}),
        2,
        "--references",
        "2",
    )
    assert doc["reference_reproducible"] is False
    assert doc["arms"]["stock_inproc"]["all_sessions_exact"] is None
    assert "did not reproduce" in doc["arms"]["stock_inproc"]["exact_note"]


def test_a_failed_second_solo_run_leaves_the_references_unchecked(monkeypatch, tmp_path):
    """A second solo run that fails (out of memory beside the other reference processes,
    as on an 80 GB card) says nothing about whether the references move: unchecked, not
    "did not reproduce", and the sessions are still compared with the references."""
    oom = {"status": "error", "error": "OutOfMemoryError: CUDA out of memory"}
    doc = fake_sweep(
        monkeypatch,
        tmp_path,
        lambda g, again: oom if again else ok_worker(g, {"pcm_sha256": "h"}),
        2,
        "--references",
        "2",
    )
    assert doc["reference_reproducible"] is None
    assert "exact_note" not in doc["arms"]["stock_inproc"]
    assert any(s["arm"] == "reference repeat" for s in doc["skipped"])


def test_a_run_keeps_per_step_hashes_only_of_referenced_sessions(monkeypatch, tmp_path):
    """Whole-stream hashes decide exactness; per-step ones only locate a difference from
    a reference, so a session without one keeps its whole-stream hashes alone."""
    doc = fake_sweep(
        monkeypatch,
        tmp_path,
        lambda g, again: ok_worker(g, {"pcm_sha256": "h", "chunk_pcm_sha256": ["a", "b"]}),
        3,
        "--references",
        "1",
        "--reference-repeats",
        "0",
    )
    hashes = doc["runs"][-1]["workers"][0]["hashes"]
    assert hashes["0"] == {"pcm_sha256": "h", "chunk_pcm_sha256": ["a", "b"]}
    assert hashes["1"] == hashes["2"] == {"pcm_sha256": "h"}
    assert doc["arms"]["stock_inproc"]["all_sessions_exact"] is True


def test_a_small_sweep_of_real_workers(tmp_path):
    out = tmp_path / "sessions_fake"
    argv = [
        "--workload",
        "tests.fake_sessions",
        "--device",
        "cpu",
        "--threads",
        "1",
        "--arms",
        "stock_procs,forgetful_inproc",
        "--n",
        "2",
        "--duration",
        "1.2",
        "--period",
        "0.05",
        "--ramp",
        "0.1",
        "--turn-chunks",
        "2,4",
        "--silence",
        "0.05,0.1",
        "--p-reset",
        "1",
        "--deadline-ms",
        "5000",
        "--references",
        "2",
        "--reference-batch",
        "2",
        "--setup-estimate",
        "5",
        "--quiet-workers",
        "--out",
        str(out),
    ]
    assert cli.main(argv) == 0
    doc = json.loads(out.with_suffix(".json").read_text())
    arms = doc["arms"]
    for name in ("stock_procs", "forgetful_inproc"):
        assert set(arms[name]) >= {
            "max_sessions_at_cadence",
            "p95_ms_at_16",
            "peak_gib_at_max",
            "all_sessions_exact",
            "sessions_hashed",
        }
        assert arms[name]["sessions_hashed"] == 2
    assert arms["stock_procs"]["all_sessions_exact"] is True  # its own reference
    assert arms["forgetful_inproc"]["all_sessions_exact"] is False  # ignores resets
    point = doc["per_n"]["stock_procs"]["2"]
    assert point["status"] == "ok" and point["chunks"] == sum(
        len(s.chunks) for s in trace(cli.trace_settings(cli.parse_args(argv)), 2)
    )
    assert len(doc["runs"][-1]["workers"]) == 1 and sorted(doc["references"]["fake_sessions"]) == [
        "0",
        "1",
    ]
    assert (
        out.with_suffix(".png").stat().st_size > 1000
        and "forgetful_inproc" in out.with_suffix(".md").read_text()
    )

    # a second call adds an arm to the same document; the references are not run again.
    # The arm serves its sessions from two worker processes (replicas), one each
    more = argv[: argv.index("--arms")] + ["--arms", "stock_replicas", "--n", "2", "--resume"]
    assert cli.main(more + argv[argv.index("--duration") :]) == 0
    doc = json.loads(out.with_suffix(".json").read_text())
    assert set(doc["arms"]) == {"stock_procs", "forgetful_inproc", "stock_replicas"}
    assert doc["arms"]["stock_replicas"]["all_sessions_exact"] is True
    workers = doc["runs"][-1]["workers"]
    assert sorted(tuple(w["sessions"]) for w in workers) == [(0,), (1,)]
    assert len(doc["commands"]) == 2 and sum(bool(r.get("reference")) for r in doc["runs"]) == 1

    # --rerun runs a point the document has again: the new run counts, the old one stays
    again = more[:-1] + ["--resume", "--rerun"] + argv[argv.index("--duration") :]
    assert cli.main(again) == 0
    doc = json.loads(out.with_suffix(".json").read_text())
    runs = [r for r in doc["runs"] if r["arm"] == "stock_replicas"]
    assert len(runs) == 2 and doc["per_n"]["stock_replicas"]["2"]["run_s"] == runs[-1]["run_s"]


def test_an_arm_of_replicas_splits_its_sessions_over_its_processes():
    replicas = fake_sessions.SESSIONS.arm("stock_replicas")
    assert replicas.groups(5) == [[0, 2, 4], [1, 3]] and replicas.groups(1) == [[0]]
    assert fake_sessions.SESSIONS.arm("stock_inproc").groups(3) == [[0, 1, 2]]
    assert fake_sessions.SESSIONS.arm("stock_procs").groups(2) == [[0], [1]]
    with pytest.raises(ValueError, match="processes"):
        Arm("x", "procs", "", processes=2)


def test_serve_summary_reads_the_serve_arms():
    """bench.sessions_serve summarise: gpus_1/gpus_2 from the sweep's arms and per-N
    points, the 2-over-1 scaling, and the Ray path's added p95 at common N."""
    from bench.sessions_serve import summarise

    doc = {
        "arms": {
            "serve_gpus_1": {"max_sessions_at_cadence": 40, "all_sessions_exact": True},
            "serve_gpus_2": {"max_sessions_at_cadence": 80, "all_sessions_exact": False},
        },
        "per_n": {
            "serve_gpus_1": {"16": {"p95_ms": 120.0}, "40": {"p95_ms": 700.0}},
            "serve_gpus_2": {"80": {"p95_ms": 650.0}, "88": {"p95_ms": 1500.0}},
            "serve_gpus_1_grpc": {"16": {"p95_ms": 115.0}},
            "adapter_lanes": {"16": {"p95_ms": 112.5}},
            "serve_gpus_2_kill": {
                "16": {
                    "status": "ok",
                    **{"sessions_hashed": 16, "sessions_exact": 16, "misses": 3},
                    **{"p95_ms": 140.0, "max_ms": 2900.0},
                },
                "24": {"status": "failed", "sessions_hashed": 24, "sessions_exact": 23},
            },
        },
        "runs": [  # where the sweep keeps each run's workers (per_n has the metrics)
            {"arm": "stock_procs", "n": 1, "reference": True, "workers": [{"server": {}}]},
            {
                "arm": "serve_gpus_2_kill",
                "n": 16,
                "workers": [{"server": {"killed_replica_0_at": 1.5e9, "restores": {"restored": 8}}}],  # fmt: skip
            },
        ],
    }
    out = summarise(doc)
    kill = out["replica_killed"]["serve_gpus_2_kill"]
    assert kill["16"] == {
        **{"status": "ok", "all_sessions_exact": True, "sessions_hashed": 16, "misses": 3},
        "p95_ms": 140.0,
        **{"max_ms": 2900.0, "killed_at": 1.5e9, "restores": {"restored": 8}},
    }
    assert kill["24"]["all_sessions_exact"] is False and kill["24"]["restores"] is None
    assert "serve_gpus_1_kill" not in out["replica_killed"]  # not run
    assert out["gpus_1"] == {
        "max_sessions_at_cadence": 40,
        "p95_ms": 700.0,
        "all_sessions_exact": True,
        "arm": "serve_gpus_1",
    }
    assert out["gpus_2"]["p95_ms"] == 650.0 and out["gpus_2"]["all_sessions_exact"] is False
    assert out["scaling_2_over_1"] == 2.0 and out["ray_added_p95_ms"] == {"16": 7.5}
    assert out["ray_added_p95_ms_by_arm"] == {
        "serve_gpus_1": {"16": 7.5},
        "serve_gpus_1_grpc": {"16": 2.5},
    }


def test_a_resumed_document_keeps_each_workloads_settings_and_reference_check(
    monkeypatch, tmp_path
):
    """Another workload's runs in the document (written before checks were kept per
    workload): its settings stay its own, and its arms, whose references nobody checked,
    make the document's verdict unknown, not true."""

    def fake_launch(wl, args, arm, groups, unpaced, limit_s=None):
        return [
            {"status": "ok", "setup_s": 1.0, "peak_mib": None,
             "chunks": {"k": [0] * len(g), "latency_ms": [10.0] * len(g)},
             "hashes": {str(i): {"pcm_sha256": "h"} for i in g}}
            for g in groups
        ]  # fmt: skip

    monkeypatch.setattr(sweep, "launch", fake_launch)
    other = {"seed": 0, "duration_s": 60.0, "period_s": 1.0, "deadline_ms": 1000.0,
             "ramp_s": 10.0, "references": [16, 44]}  # fmt: skip
    prior = {
        "workload": "token2wav",
        "settings": other,
        "arms": {"adapter_lanes": {"workload": "token2wav", "shape": "inproc", "what": "x"}},
        "runs": [{"arm": "adapter_lanes", "n": 16, "status": "ok", "misses": 0, "run_s": 60.0,
                  "peak_gib": 1.0, "sessions_hashed": 16, "sessions_exact": 16}],
    }  # fmt: skip
    args = cli.parse_args(
        ["--workload", "tests.fake_sessions", "--arms", "stock_inproc", "--n", "2",
         "--duration", "1", "--period", "0.08", "--references", "2", "--resume",
         "--out", str(tmp_path / "s")]
    )  # fmt: skip
    args.arm_n = {"stock_inproc": [2]}
    run = sweep.Sweep(fake_sessions.SESSIONS, args, prior, sweep.GpuSampler(99))
    run.sweep()
    doc = run.write(complete=True)
    assert doc["workloads"]["token2wav"]["settings"] == other
    assert doc["workloads"]["fake_sessions"]["settings"]["period_s"] == 0.08
    assert doc["arms"]["stock_inproc"]["reference_reproducible"] is True
    assert doc["arms"]["adapter_lanes"]["reference_reproducible"] is None
    assert doc["arms"]["adapter_lanes"]["all_sessions_exact"] is True
    assert doc["reference_reproducible"] is None  # token2wav's references were not checked
    text = summary.markdown(doc)
    assert "token2wav: trace seed 0" in text and "**unchecked**" in text

    # resumed again: every run is there, references checked, nothing launches
    monkeypatch.setattr(sweep, "launch", lambda *a, **k: pytest.fail("launched"))
    again = sweep.Sweep(fake_sessions.SESSIONS, args, doc, sweep.GpuSampler(99))
    again.sweep()
    assert again.write(complete=True)["arms"]["stock_inproc"]["reference_reproducible"] is True


def test_resumed_references_that_were_never_checked_are_run_solo_again(monkeypatch, tmp_path):
    launched = []

    def fake_launch(wl, args, arm, groups, unpaced, limit_s=None):
        launched.append(groups)
        return [{"status": "ok", "hashes": {str(i): {"pcm_sha256": "h"} for i in g}}
                for g in groups]  # fmt: skip

    monkeypatch.setattr(sweep, "launch", fake_launch)
    prior = {"workload": "fake_sessions", "references": {"fake_sessions": {
        "0": {"pcm_sha256": "h"}, "1": {"pcm_sha256": "h"}, "2": {"pcm_sha256": "h"}}}}  # fmt: skip
    args = cli.parse_args(
        ["--workload", "tests.fake_sessions", "--arms", "stock_inproc", "--references", "3",
         "--resume", "--out", str(tmp_path / "s")]
    )  # fmt: skip
    args.arm_n = {"stock_inproc": []}
    run = sweep.Sweep(fake_sessions.SESSIONS, args, prior, sweep.GpuSampler(99))
    run.references()
    assert launched == [[[0], [1]]]  # only the second solo runs of the first two
    assert run.reference_runs == {str(i): {"status": "ok", "reproducible": True} for i in (0, 1)}
