"""Statistics of the Token2Wav benchmark: per-block summaries, paired ratios, aggregation.

Pure functions over the plain dicts that ``bench.token2wav`` workers print (no torch,
no model), so they are unit-tested in seconds (tests/test_bench_stats.py).

Conventions (DESIGN §6):

* A *block* runs every cell once, each in a fresh process, on one seed and token
  stream. Within a block, a cell's latency is the **median** (p50) and the 95th
  percentile (p95, numpy's linear interpolation) of its measured window's per-chunk
  wall times; other per-chunk quantities (busy time, kernel counts, flow/vocoder
  split) are per-block medians too.
* Across blocks, a cell's headline number is the **median of its per-block values**.
* Paired ratios vs the reference cell (B0) are formed **per block** (cell / B0 in the
  same block) and summarised by their geometric mean with a 95 % **t-interval on the
  log ratios** (df = blocks - 1; exponentiated back). With one block there is no
  interval (``ci95`` is None and ``ci_method`` says so). With 2-4 blocks the interval
  is valid under a log-normal assumption but wide; that is what it should be.
* ``exact`` is True only when the cell produced a float32 PCM SHA-256 in **every**
  block and each equals the reference's SHA in that block. ``counts_as_result`` is
  ``exact`` and ran in every block; a cell without it is reported, never claimed.
* A cell's status: ``ok`` (every block), ``partial`` (some blocks; the others failed or
  were skipped), ``failed`` (none ran through), ``skipped`` (none was launched).
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

REFERENCE = "B0"

# Two-sided 97.5 % quantiles of Student's t for df = 1..30 (scipy.stats.t.ppf(0.975, df)),
# so the intervals need nothing beyond numpy.
_T975 = (
    12.706204736,
    4.302652730,
    3.182446305,
    2.776445105,
    2.570581836,
    2.446911851,
    2.364624252,
    2.306004135,
    2.262157163,
    2.228138852,
    2.200985160,
    2.178812830,
    2.160368656,
    2.144786688,
    2.131449546,
    2.119905299,
    2.109815578,
    2.100922040,
    2.093024054,
    2.085963447,
    2.079613845,
    2.073873068,
    2.068657610,
    2.063898562,
    2.059538553,
    2.055529439,
    2.051830516,
    2.048407142,
    2.045229642,
    2.042272456,
)


def t975(df: int) -> float:
    """The 0.975 quantile of Student's t with ``df`` degrees of freedom (normal beyond 30)."""
    if df < 1:
        raise ValueError("df must be >= 1")
    return _T975[df - 1] if df <= len(_T975) else 1.959963985


def _clean(values: Iterable[Any]) -> list[float]:
    out = []
    for v in values:
        if v is None:
            continue
        f = float(v)
        if math.isfinite(f):
            out.append(f)
    return out


def median(values: Iterable[Any]) -> float | None:
    v = _clean(values)
    return float(np.median(v)) if v else None


def percentile(values: Iterable[Any], q: float) -> float | None:
    v = _clean(values)
    return float(np.percentile(v, q)) if v else None


def mean(values: Iterable[Any]) -> float | None:
    v = _clean(values)
    return float(np.mean(v)) if v else None


def paired_ratio(num: Sequence[Any], den: Sequence[Any]) -> dict | None:
    """Per-block ratios num[i] / den[i], their geometric mean and a 95 % t-interval.

    Pairs with a missing or non-positive member are dropped. Returns None when no
    pair is left.
    """
    ratios = []
    for a, b in zip(num, den):
        if a is None or b is None:
            continue
        a, b = float(a), float(b)
        if a > 0 and b > 0 and math.isfinite(a) and math.isfinite(b):
            ratios.append(a / b)
    if not ratios:
        return None
    logs = np.log(np.asarray(ratios))
    n = len(ratios)
    gm = float(np.exp(logs.mean()))
    out: dict[str, Any] = {
        "n": n,
        "ratios": ratios,
        "geomean": gm,
        "median": float(np.median(ratios)),
        "ci95": None,
        "ci_method": "one block: no interval",
    }
    if n >= 2:
        sd = float(logs.std(ddof=1))
        half = t975(n - 1) * sd / math.sqrt(n)
        out["ci95"] = [float(np.exp(logs.mean() - half)), float(np.exp(logs.mean() + half))]
        out["ci_method"] = f"t-interval on log ratios over {n} blocks (df={n - 1})"
    return out


def invert_ratio(r: dict | None) -> dict | None:
    """The same paired summary for den / num (e.g. a speedup from a latency ratio)."""
    if r is None:
        return None
    out = dict(r)
    out["ratios"] = [1.0 / x for x in r["ratios"]]
    out["geomean"] = 1.0 / r["geomean"]
    out["median"] = float(np.median(out["ratios"]))
    if r["ci95"] is not None:
        out["ci95"] = [1.0 / r["ci95"][1], 1.0 / r["ci95"][0]]
    return out


# ------------------------------------------------------------------ per block


def block_summary(res: Mapping[str, Any] | None) -> dict:
    """One worker's raw result -> the per-block numbers of that cell."""
    if not res or res.get("status") != "ok":
        return {"ok": False, "status": (res or {}).get("status", "missing")}
    window = res.get("window_ms") or []
    split = res.get("split") or {}
    prof = res.get("profile") or {}
    mem = res.get("memory") or {}
    return {
        "ok": True,
        "status": "ok",
        "p50_ms": median(window),
        "p95_ms": percentile(window, 95),
        "mean_ms": mean(window),
        "min_ms": min(window) if window else None,
        "max_ms": max(window) if window else None,
        "flow_ms": median(split.get("flow_ms") or []),
        "vocoder_ms": median(split.get("vocoder_ms") or []),
        "other_ms": median(split.get("other_ms") or []),
        "busy_ms": prof.get("busy_ms"),
        "flow_busy_ms": prof.get("flow_busy_ms"),
        "vocoder_busy_ms": prof.get("vocoder_busy_ms"),
        "kernels_per_chunk": prof.get("kernels_per_chunk"),
        "kernel_launch_calls_per_chunk": prof.get("kernel_launch_calls_per_chunk"),
        "graph_launch_calls_per_chunk": prof.get("graph_launch_calls_per_chunk"),
        "peak_mib": mem.get("process_peak_mib"),
        "window_peak_mib": mem.get("window_peak_mib"),
        "peak_reserved_mib": mem.get("process_peak_reserved_mib"),
        "setup_s": (res.get("timings_s") or {}).get("setup"),
        "pcm_sha256": res.get("pcm_sha256"),
    }


_MEDIAN_KEYS = (
    "p50_ms",
    "p95_ms",
    "mean_ms",
    "flow_ms",
    "vocoder_ms",
    "other_ms",
    "busy_ms",
    "flow_busy_ms",
    "vocoder_busy_ms",
    "kernels_per_chunk",
    "kernel_launch_calls_per_chunk",
    "graph_launch_calls_per_chunk",
    "peak_mib",
    "window_peak_mib",
    "peak_reserved_mib",
    "setup_s",
)


def _sum_counters(dicts: Iterable[Mapping[str, Any] | None]) -> dict:
    out: dict[str, int] = {}
    for d in dicts:
        for k, v in (d or {}).items():
            out[k] = out.get(k, 0) + int(v)
    return out


def replay_summary(results: Sequence[Mapping[str, Any] | None]) -> dict | None:
    """Replay counters of a bound cell summed over blocks (None for unbound cells)."""
    reps = [r.get("replay") for r in results if r and r.get("status") == "ok" and r.get("replay")]
    if not reps:
        return None
    names = sorted({n for rep in reps for n in rep.get("callables", {})})
    per = {}
    for n in names:
        cs = [rep["callables"][n] for rep in reps if n in rep.get("callables", {})]
        per[n] = {
            "hits": sum(c.get("hits", 0) for c in cs),
            "misses": _sum_counters(c.get("misses") for c in cs),
            "window_hits": sum(c.get("window_hits", 0) for c in cs),
            "window_misses": _sum_counters(c.get("window_misses") for c in cs),
            "captured_classes": max((c.get("captured_classes", 0) for c in cs), default=0),
            "classes": max((c.get("classes", 0) for c in cs), default=0),
            "rejected": sorted({str(c["rejected"]) for c in cs if c.get("rejected")}),
            "invalidations": sum(c.get("invalidations", 0) for c in cs),
        }
    return {
        "blocks": len(reps),
        "hits": sum(p["hits"] for p in per.values()),
        "misses": _sum_counters(p["misses"] for p in per.values()),
        "window_hits": sum(p["window_hits"] for p in per.values()),
        "window_misses": _sum_counters(p["window_misses"] for p in per.values()),
        "capture_s": median(rep.get("capture_s") for rep in reps),
        "warmup_s": median(rep.get("warmup_s") for rep in reps),
        "callables": per,
    }


def vendor_graph_summary(results: Sequence[Mapping[str, Any] | None]) -> dict | None:
    """Vendor DiT graph counters of the vendor_* controls summed over ok blocks."""
    ok = [r for r in results if r and r.get("status") == "ok"]
    sets = [(r.get("setup") or {}) for r in ok]
    sets = [x for x in sets if x.get("vendor_counts") is not None]
    if not sets:
        return None
    return {
        "blocks": len(sets),
        "buckets": sets[0].get("vendor_buckets"),
        "max_size": sets[0].get("vendor_max_size"),
        "estimator_calls": sum(int(x["vendor_counts"].get("estimator_calls", 0)) for x in sets),
        "bucket_replays": sum(int(x["vendor_counts"].get("bucket_replays", 0)) for x in sets),
    }


def compile_summary(results: Sequence[Mapping[str, Any] | None]) -> dict | None:
    """compile_ro's compile figures: medians over ok blocks, frames compiled in total and
    inside the window summed (a frame compiled in the window is a recompile there)."""
    sets = [
        (r.get("setup") or {})
        for r in results
        if r and r.get("status") == "ok" and (r.get("setup") or {}).get("compile_kwargs")
    ]
    if not sets:
        return None
    return {
        "blocks": len(sets),
        "compile_and_first_calls_s": median(x.get("compile_and_first_calls_s") for x in sets),
        "compile_and_first_calls_s_by_block": [x.get("compile_and_first_calls_s") for x in sets],
        "frames_compiled": median(x.get("frames_compiled") for x in sets),
        "unique_graphs": median(x.get("unique_graphs") for x in sets),
        "graph_breaks": median(x.get("graph_breaks") for x in sets),
        "frames_compiled_in_window": sum(
            int(x.get("frames_compiled_in_window") or 0) for x in sets
        ),
        "compile_kwargs": sets[0].get("compile_kwargs"),
    }


def aggregate(
    blocks: Sequence[Mapping[str, Any]], cells: Sequence[str], reference: str = REFERENCE
) -> dict:
    """Cells' summaries across blocks.

    ``blocks`` is the raw list the driver keeps: ``{"block": b, "seed": s,
    "results": {cell: worker_result}}``. Returns ``{cell: summary}`` for ``cells``.
    """
    out: dict[str, dict] = {}
    per_block = {c: [block_summary((b.get("results") or {}).get(c)) for b in blocks] for c in cells}
    ref_rows = per_block.get(reference) or [
        block_summary((b.get("results") or {}).get(reference)) for b in blocks
    ]
    for c in cells:
        rows = per_block[c]
        raw = [(b.get("results") or {}).get(c) for b in blocks]
        ok = [r for r in rows if r["ok"]]
        statuses = {r["status"] for r in rows if not r["ok"]}
        if ok:
            status = "ok" if len(ok) == len(rows) else "partial"
        elif statuses and statuses <= {"skipped", "missing"}:
            status = "skipped"  # never launched (time budget, or an earlier failure)
        else:
            status = "failed"
        s: dict[str, Any] = {"status": status, "blocks_ok": f"{len(ok)}/{len(rows)}"}
        for k in _MEDIAN_KEYS:
            s[k] = median(r.get(k) for r in ok)
        shas = [r.get("pcm_sha256") if r["ok"] else None for r in rows]
        s["pcm_sha256"] = shas[0] if shas else None
        s["pcm_sha256_by_block"] = shas
        # exactness against the reference, block by block
        ref_shas = [r.get("pcm_sha256") if r["ok"] else None for r in ref_rows]
        same = [a is not None and a == b for a, b in zip(shas, ref_shas)]
        if c == reference:
            s["exact"] = bool(rows) and all(x is not None for x in shas)
            s["exact_note"] = "reference"
        else:
            s["exact"] = bool(rows) and len(same) == len(rows) and all(same)
            s["exact_blocks"] = f"{sum(same)}/{len(rows)}"
        # a result: ran in every block and bit-exact with the reference there
        s["counts_as_result"] = s["status"] == "ok" and bool(s["exact"])
        # derived
        if s["busy_ms"] and s["p50_ms"]:
            s["wall_over_busy"] = s["p50_ms"] / s["busy_ms"]
            s["host_slack"] = 1.0 - s["busy_ms"] / s["p50_ms"]
        else:
            s["wall_over_busy"] = s["host_slack"] = None

        # paired ratios vs the reference
        def col(rws, key):
            return [r.get(key) if r["ok"] else None for r in rws]

        if c != reference:
            lat = paired_ratio(col(rows, "p50_ms"), col(ref_rows, "p50_ms"))
            s["p50_ratio_vs_" + reference] = lat
            s["speedup_vs_" + reference] = invert_ratio(lat)
            s["p95_ratio_vs_" + reference] = paired_ratio(
                col(rows, "p95_ms"), col(ref_rows, "p95_ms")
            )
            s["peak_ratio_vs_" + reference] = paired_ratio(
                col(rows, "peak_mib"), col(ref_rows, "peak_mib")
            )
            s["window_peak_ratio_vs_" + reference] = paired_ratio(
                col(rows, "window_peak_mib"), col(ref_rows, "window_peak_mib")
            )
            s["busy_ratio_vs_" + reference] = paired_ratio(
                col(rows, "busy_ms"), col(ref_rows, "busy_ms")
            )
        s["replay"] = replay_summary(raw)
        vg = vendor_graph_summary(raw)
        if vg is not None:
            s["vendor_graphs"] = vg
        cs = compile_summary(raw)
        if cs is not None:
            s["compile"] = cs
        errors = [
            {
                "block": b.get("block"),
                "status": (r or {}).get("status", "missing"),
                "error": (r or {}).get("error") or ("no result" if not r else None),
                **({"reason": r["reason"]} if r and r.get("reason") else {}),
            }
            for b, r in zip(blocks, raw)
            if not r or r.get("status") != "ok"
        ]
        if errors:
            s["errors"] = errors
            reasons = [e.get("reason") or e.get("error") for e in errors]
            s["reason"] = next((x for x in reasons if x), None)
        s["per_block"] = rows
        out[c] = s
    return out


def rotate(cells: Sequence[str], k: int) -> list[str]:
    """Cell order of block ``k``: the list rotated left by ``k`` (a cyclic Latin square)."""
    cells = list(cells)
    if not cells:
        return []
    k %= len(cells)
    return cells[k:] + cells[:k]
