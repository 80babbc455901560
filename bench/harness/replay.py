"""Replay telemetry of a ``Binding``: a worker's record and its sum over blocks."""

from __future__ import annotations

from collections import Counter
from typing import Any, Iterable, Mapping, Sequence

MIB = 2**20


def counts(binding: Any) -> dict:
    """{callable: (hits, {reason: misses})} now (empty without a binding)."""
    if binding is None:
        return {}
    return {
        n: (int(r.hits), {k: int(v) for k, v in r.misses.items()})
        for n, r in binding.replays.items()
    }


def sessions_record(binding: Any) -> dict:
    """What a session server reports with a cadence run: its session pool's counters and
    every callable's hits, misses and first miss of each reason, over all lanes."""
    st = binding.stats()
    return {
        "sessions": st["sessions"],
        "params": st["params"],
        "replay": {
            name: {"hits": c["hits"], "misses": c["misses"], "details": c["miss_details"]}
            for name, c in st["callables"].items()
        },
    }


def record(binding: Any, before: dict) -> dict | None:
    """A worker's replay record: the binding's per-callable stats, and the hits and
    misses since ``before`` (a ``counts`` reading at the start of the window)."""
    if binding is None:
        return None
    after, callables = counts(binding), {}
    for name, s in binding.stats()["callables"].items():
        hits, misses = after.get(name, (0, {}))
        hits0, misses0 = before.get(name, (0, {}))
        window = {k: v - misses0.get(k, 0) for k, v in misses.items()}
        classes = s["classes"]
        callables[name] = {
            **{
                k: s.get(k)
                for k in ("hits", "misses", "rejected", "effect", "capture_s", "warmup_s")
            },
            "invalidations": s.get("invalidations", 0),
            "window_hits": hits - hits0,
            "window_misses": {k: v for k, v in window.items() if v},
            "classes": len(classes),
            "captured_classes": sum(c["status"] == "captured" for c in classes),
            "class_status": {c["name"]: c["status"] for c in classes},
            "capture_reserved_mib": (s.get("capture_reserved_bytes") or 0) / MIB,
            "capture_allocated_mib": (s.get("capture_allocated_bytes") or 0) / MIB,
        }
    return {
        "capture_s": sum(float(c["capture_s"] or 0.0) for c in callables.values()),
        "warmup_s": sum(float(c["warmup_s"] or 0.0) for c in callables.values()),
        "callables": callables,
    }


def _sum(dicts: Iterable[Mapping[str, Any] | None]) -> dict:
    """Per-key sums (zeros kept, unlike ``Counter`` addition)."""
    out: Counter = Counter()
    for d in dicts:
        out.update(d or {})
    return dict(out)


def summary(results: Sequence[Mapping[str, Any] | None]) -> dict | None:
    """Replay counters of a bound cell summed over its ok blocks (None if unbound)."""
    from .stats import median

    reps = [r["replay"] for r in results if r and r.get("status") == "ok" and r.get("replay")]
    if not reps:
        return None
    per = {}
    for n in sorted({n for rep in reps for n in rep.get("callables", {})}):
        cs = [rep["callables"][n] for rep in reps if n in rep.get("callables", {})]
        per[n] = {
            **{k: sum(c.get(k, 0) for c in cs) for k in ("hits", "window_hits", "invalidations")},
            **{k: _sum(c.get(k) for c in cs) for k in ("misses", "window_misses")},
            **{k: max(c.get(k, 0) for c in cs) for k in ("captured_classes", "classes")},
            "rejected": sorted({str(c["rejected"]) for c in cs if c.get("rejected")}),
        }
    return {
        "blocks": len(reps),
        **{k: sum(p[k] for p in per.values()) for k in ("hits", "window_hits")},
        **{k: _sum(p[k] for p in per.values()) for k in ("misses", "window_misses")},
        **{k: median(rep.get(k) for rep in reps) for k in ("capture_s", "warmup_s")},
        "callables": per,
    }
