"""From worker records to the numbers of a sweep: per-run metrics, the per-arm summary
(the ``arms`` object tools read), the markdown tables and the p95-vs-N plot."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

import pandas as pd

GIB = 2**30


def _f(v: Any) -> float | None:
    return None if v is None or pd.isna(v) else round(float(v), 3)


def exactness(results: Sequence[dict], refs: Mapping[str, dict], keys: Sequence[str]) -> dict:
    """Each session's stream hashes against its solo reference (where there is one)."""
    hashed = exact = 0
    differ = []
    for r in results:
        for i, h in (r.get("hashes") or {}).items():
            ref = refs.get(str(i))
            if ref is None:
                continue
            hashed += 1
            same = all(h.get(k) is not None and h.get(k) == ref.get(k) for k in keys)
            exact += same
            differ += [] if same else [int(i)]
    return {"sessions_hashed": hashed, "sessions_exact": exact, "sessions_differing": differ}


def run_metrics(results: Sequence[dict], deadline_ms: float, busy: float | None) -> dict:
    """Latency (arrival -> output), misses, first packets, memory of one (arm, N) run."""
    chunks = pd.concat([pd.DataFrame(r.get("chunks") or {}) for r in results], ignore_index=True)
    lat = chunks.get("latency_ms", pd.Series(dtype=float))
    first = lat[chunks["k"] == 0] if "k" in chunks else lat
    peaks = [r.get("peak_mib") for r in results]
    return {
        "chunks": int(len(lat)),
        **{f"p{q}_ms": _f(lat.quantile(q / 100)) for q in (50, 95, 99)},
        "max_ms": _f(lat.max()),
        "misses": int((lat > deadline_ms).sum()),
        "turns": int(len(first)),
        **{f"first_packet_p{q}_ms": _f(first.quantile(q / 100)) for q in (50, 95)},
        "first_packet_max_ms": _f(first.max()),
        "peak_gib": None if None in peaks else _f(sum(peaks) * 2**20 / GIB),
        "gpu_busy_share": busy,
        "setup_s": _f(max((r.get("setup_s") or 0.0) for r in results)),
    }


# what a session pool counts per run (runtime/serving/sessions.py, lane_scheduler.py)
POOL_COUNTERS = (
    "affinity_hits", "affinity_misses", "eager_steps", "background_captures",
    "background_capture_s", "capture_errors",
)  # fmt: skip


def pool_counters(results: Sequence[dict]) -> dict:
    """A run's session-pool counters from its workers' server stats (adapter arms): the
    longest lane wait, lane 0's capture at bind, the scheduler's counts, evictions; for a
    lockstep arm its width, ticks, rows per tick and mean tick time."""
    ticks = [((r.get("server") or {}).get("lockstep") or {}) for r in results]
    ticks = [t for t in ticks if t]
    if ticks:  # a lockstep arm: one batched call per tick for its sessions
        n = max(1, sum(t["ticks"] for t in ticks))
        total = lambda key: sum(t.get(key, 0) for t in ticks)  # noqa: E731
        longest = lambda key: _f(1e3 * max(t.get(key, 0.0) for t in ticks))  # noqa: E731
        return {
            "lockstep_width": max(t["width"] for t in ticks),
            "ticks": total("ticks"),
            "rows_per_tick": _f(total("rows") / n),
            "tick_ms_mean": _f(1e3 * total("tick_s") / n),
            # where a tick cycle's time goes besides the tick: waiting for sessions or
            # the beat (gap), ticks the beat started without every session, the longest
            # stall, row masks (hold) and slot resets
            "gap_ms_mean": _f(1e3 * total("gap_s") / n),
            "partial_ticks": total("partial_ticks"),
            "max_tick_ms": longest("max_tick_s"),
            "max_gap_ms": longest("max_gap_s"),
            "holds": total("holds"),
            "hold_s": _f(total("hold_s")),
            "reset_s": _f(total("reset_s")),
            **audit_counters([t["audit"] for t in ticks if "audit" in t]),
        }
    pools = [((r.get("server") or {}).get("sessions") or {}) for r in results]
    pools = [p for p in pools if p]
    if not pools:
        return {}
    params = [((r.get("server") or {}).get("params") or {}) for r in results]
    bind = [c["seconds"] for p in pools for c in p.get("lane_capture", []) if c["lane"] == 0]
    return {
        "max_lane_wait_ms": _f(1e3 * max(p.get("max_lane_wait_s", 0.0) for p in pools)),
        # a capture holds the eager lock: how long eager steps queued behind it
        "max_eager_lock_wait_ms": _f(1e3 * max(p.get("max_eager_lock_wait_s", 0.0) for p in pools)),
        "capture_s_at_bind": _f(max(bind)) if bind else None,
        **{k: sum(p.get(k, 0) for p in pools) for k in POOL_COUNTERS},
        "evictions": sum(p.get("evictions", 0) for p in params),
        "regrows": sum(p.get("regrows", 0) for p in params),
    }


def audit_counters(audits: Sequence[dict]) -> dict:
    """A lockstep arm's run-time audit (runtime/serving/lockstep_audit.py): sessions its
    batch-1 shadow followed, frames it checked bit for bit, divergences, and followings
    it stopped (behind, a failed tick, a shadow error); nothing for an arm without."""
    if not audits:
        return {}
    total = lambda key: sum(a.get(key, 0) for a in audits)  # noqa: E731
    stopped = ("stopped_behind", "stopped_tick_failed", "shadow_errors")
    return {
        "audit_followed": total("followed"),
        "audit_checks": total("checks"),
        "audit_divergences": total("divergences"),
        "audit_stopped": sum(total(k) for k in stopped),
    }


def arm_summary(points: Mapping[int, dict], min_run_s: float) -> dict:
    """What tools read per arm: the largest N with zero misses over a run (its streaming
    window, ``run_s``) of at least ``min_run_s``, p95 at N = 16, the peak at that largest
    N, and exactness."""
    ok = {n: p for n, p in points.items() if p.get("status") == "ok"}
    clean = [n for n, p in ok.items() if p["misses"] == 0 and (p.get("run_s") or 0.0) >= min_run_s]
    best = max(clean, default=None)
    hashed = sum(p.get("sessions_hashed", 0) for p in ok.values())
    exact = sum(p.get("sessions_exact", 0) for p in ok.values())
    top = ok.get(max(ok)) if ok else {}
    return {
        "max_sessions_at_cadence": best,
        "p95_ms_at_16": ok.get(16, {}).get("p95_ms"),
        "max_lane_wait_ms_at_max_n": top.get("max_lane_wait_ms"),
        "peak_gib_at_max": ok[best]["peak_gib"] if best is not None else None,
        "all_sessions_exact": (exact == hashed) if hashed else None,
        "sessions_hashed": hashed,
    }


def _reproducible(check: dict | None) -> str:
    sessions = (check or {}).get("sessions") or {}
    if not sessions:
        return "**unchecked**"
    bad = [i for i, r in sessions.items() if not r.get("reproducible")]
    if bad:
        return f"**NO** (sessions {', '.join(bad)}): no session counts as exact"
    return f"yes (sessions {', '.join(sessions)})"


def _workload_lines(doc: dict) -> list[str]:
    """Each workload's trace and whether its references reproduced (a document may hold
    several workloads' arms, each run with its own settings)."""
    workloads = doc.get("workloads") or {doc["workload"]: {"settings": doc["settings"]}}
    lines = []
    for name, w in workloads.items():
        s = w.get("settings")
        if not s:
            lines.append(f"- {name}: settings not recorded (runs of an older harness)")
            continue
        lines += [
            f"- {name}: trace seed {s['seed']}, {s['duration_s']} s per run, one chunk per "
            f"{s['period_s']} s during a turn, deadline {s['deadline_ms']} ms; sessions arrive "
            f"over {s['ramp_s']} s; references: each of the sessions {s['references']} "
            f"alone on its reference arm in a fresh process",
            f"  - references reproducible (a second solo run of the first sessions): "
            f"{_reproducible(w.get('reference_check'))}",
        ]
    return lines


def markdown(doc: dict) -> str:
    arms = pd.DataFrame.from_dict(doc["arms"], orient="index")
    arms = arms.drop(columns=["what"], errors="ignore")
    points = pd.DataFrame(
        [{"arm": a, "N": int(n), **p} for a, ps in doc["per_n"].items() for n, p in ps.items()]
    )
    cols = "arm N status p50_ms p95_ms p99_ms misses chunks first_packet_p95_ms".split()
    cols += "gpu_busy_share peak_gib sessions_exact sessions_hashed".split()
    lines = [
        f"# Paced sessions: {doc['workload']} on {doc.get('gpu')}",
        "",
        f"- command: `{doc['command']}`; git `{doc.get('git_commit')}`; torch {doc.get('torch')}",
        *_workload_lines(doc),
        "",
        arms.to_markdown() if len(arms) else "(no arm ran)",
        "",
    ]
    if len(points):
        points = points.reindex(columns=cols).sort_values(["arm", "N"])
        lines += [points.to_markdown(index=False, floatfmt=".3g"), ""]
    lines += [
        f"- audit: {a} N={n}: a batch-1 shadow followed {p['audit_followed']} sessions and "
        f"checked {p['audit_checks']} frames bit for bit, {p['audit_divergences']} diverged, "
        f"{p['audit_stopped']} followings stopped"
        for a, ps in doc["per_n"].items()
        for n, p in ps.items()
        if "audit_checks" in p
    ]
    lines += [f"- skipped: {k['arm']} N={k['n']}: {k['why']}" for k in doc.get("skipped", [])]
    return "\n".join(lines) + "\n"


def plot(doc: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for arm, ps in doc["per_n"].items():
        pts = sorted((int(n), p["p95_ms"]) for n, p in ps.items() if p.get("p95_ms") is not None)
        if pts:
            ax.plot(*zip(*pts), marker="o", label=arm)
    workloads = doc.get("workloads") or {doc["workload"]: {"settings": doc["settings"]}}
    deadlines = {(w.get("settings") or {}).get("deadline_ms") for w in workloads.values()}
    for ms in sorted(d for d in deadlines if d is not None):
        ax.axhline(ms, color="grey", ls="--", lw=0.8, label=f"deadline {ms:g} ms")
    ax.set(xlabel="concurrent sessions N", ylabel="chunk latency p95 (ms)", yscale="log")
    ax.set_title(f"{doc['workload']}: p95 arrival-to-output latency vs N, {doc.get('gpu')}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
