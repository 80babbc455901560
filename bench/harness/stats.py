"""Statistics of a matched-block benchmark, on one long pandas table (a row per cell
and block) of the plain dicts workers print. The conventions are the document's
``method`` (``document.method``): per-block p50/p95, medians over blocks, paired ratios
with a t-interval on log ratios (``scipy.stats.t``), exactness by stream hashes.
``counts_as_result``: exact and ran in every block. Status: ``ok`` (every block),
``partial`` (some), ``failed`` (none ran through), ``skipped`` (none was launched).
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import pandas as pd
from scipy import stats as sps

from . import replay
from .workload import Workload


def _num(v: Any) -> float | None:
    """A finite float, or None (pandas' NaN included)."""
    if v is None:
        return None
    f = float(v)
    return f if math.isfinite(f) else None


def median(values: Iterable[Any]) -> float | None:
    return _num(pd.Series([_num(v) for v in values], dtype=float).median())


def paired_ratio(num: Sequence[Any], den: Sequence[Any]) -> dict | None:
    """Per-block ratios num[i] / den[i], their geometric mean and a 95 % t-interval.
    Pairs with a missing or non-positive member are dropped; None when none is left."""
    pairs = pd.DataFrame(
        [(_num(a), _num(b)) for a, b in zip(num, den)], columns=[0, 1], dtype=float
    )
    ratios = (pairs[0] / pairs[1])[(pairs[0] > 0) & (pairs[1] > 0)]
    if ratios.empty:
        return None
    logs, n = np.log(ratios), len(ratios)
    out: dict[str, Any] = {"n": n, "ratios": [float(r) for r in ratios]}
    out.update(geomean=float(np.exp(logs.mean())), median=float(ratios.median()), ci95=None)
    out["ci_method"] = "one block: no interval"
    if n >= 2:
        half = sps.t.ppf(0.975, n - 1) * logs.std(ddof=1) / math.sqrt(n)
        out["ci95"] = [float(np.exp(logs.mean() - half)), float(np.exp(logs.mean() + half))]
        out["ci_method"] = f"t-interval on log ratios over {n} blocks (df={n - 1})"
    return out


def block_row(wl: Workload, res: Mapping[str, Any] | None) -> dict:
    """One worker's raw result -> the per-block numbers of that cell."""
    if not res or res.get("status") != "ok":
        return {"ok": False, "status": (res or {}).get("status", "missing")}
    u = wl.unit
    w = pd.Series(res.get("window_ms") or [], dtype=float)
    split, prof = res.get("split") or {}, res.get("profile") or {}
    mem, timings = res.get("memory") or {}, res.get("timings_s") or {}
    parts = [*wl.parts, "other"] if wl.parts else []
    return {
        "ok": True,
        "status": "ok",
        "p50_ms": _num(w.median()),
        "p95_ms": _num(w.quantile(0.95)),
        "mean_ms": _num(w.mean()),
        "min_ms": _num(w.min()),
        "max_ms": _num(w.max()),
        **{f"{p}_ms": median(split.get(f"{p}_ms") or []) for p in parts},
        "busy_ms": prof.get("busy_ms"),
        **{f"{p}_busy_ms": prof.get(f"{p}_busy_ms") for p in wl.parts},
        **{f"{k}_per_{u}": prof.get(f"{k}_per_{u}") for k in PER_STEP_COUNTS},
        "peak_mib": mem.get("process_peak_mib"),
        "window_peak_mib": mem.get("window_peak_mib"),
        "peak_reserved_mib": mem.get("process_peak_reserved_mib"),
        "setup_s": timings.get("setup"),
        "build_s": timings.get("build"),
        "capture_s": (res.get("replay") or {}).get("capture_s"),
        "worker_wall_s": res.get("process_wall_s", res.get("worker_wall_s")),
        **{s.key: res.get(s.key) for s in wl.streams},
    }


PER_STEP_COUNTS = ("kernels", "kernel_launch_calls", "graph_launch_calls")
# {ratio name: metric}: p50_ratio -> p50_ms, peak_ratio -> peak_mib, ...
METRICS = ("p50_ms", "p95_ms", "peak_mib", "window_peak_mib", "busy_ms")
RATIO_METRICS = {m.rsplit("_", 1)[0] + "_ratio": m for m in METRICS}


def first_divergence(wl: Workload, a: Mapping, b: Mapping) -> dict | None:
    """The first step whose SHA of some stream differs between two ok results."""
    keys = [(s.name, s.step_key) for s in wl.streams]
    if any(len(a.get(k) or []) != len(b.get(k) or []) for _, k in keys):
        return {"what": keys[0][1], wl.unit: None, "note": f"different {wl.unit} counts"}
    for i in range(len(a.get(keys[0][1]) or [])):
        for name, k in keys:
            if a[k][i] != b[k][i]:
                return {"what": name, wl.unit: i}
    return None


def reference_check(wl: Workload, blocks: Sequence[Mapping[str, Any]]) -> dict:
    """Whether the reference reproduced itself: per block, its result against the second
    fresh run of the same (block, seed) (``reference_repeat``, driver.py), every step of
    every stream. ``reproducible`` is None where no block has both runs."""
    per_block = []
    for b in blocks:
        first, again = (b.get("results") or {}).get(wl.reference), b.get("reference_repeat")
        if not (first and again and first.get("status") == again.get("status") == "ok"):
            continue
        d = first_divergence(wl, first, again)
        per_block.append({"block": b.get("block"), "reproducible": d is None, "divergence": d})
    return {
        "reproducible": all(r["reproducible"] for r in per_block) if per_block else None,
        "blocks_checked": len(per_block),
        "steps": min((len(b.get("results", {}).get(wl.reference, {}).get(wl.streams[0].step_key)
                          or []) for b in blocks), default=0) if per_block else 0,
        "per_block": per_block,
    }  # fmt: skip


def unreproducible_blocks(wl: Workload, blocks: Sequence[Mapping[str, Any]]) -> set:
    """Blocks whose reference did not reproduce itself: nothing is exact against them."""
    return {r["block"] for r in reference_check(wl, blocks)["per_block"] if not r["reproducible"]}


def exact_reference(wl: Workload, cell: str) -> str:
    """The cell whose bytes ``cell`` must equal."""
    return getattr(wl.by_name.get(cell), "exact_against", None) or wl.reference


def exactness(wl: Workload, cell: str, raw: list, ref_raw: list, blocks: list) -> dict:
    """``exact`` against the cell's reference, block by block where the reference ran."""
    ok = [bool(r and r.get("status") == "ok") for r in raw]
    ref = exact_reference(wl, cell)
    if cell == ref or any(getattr(c, "exact_against", None) == cell for c in wl.cells):
        return {"exact": any(ok), "exact_note": "reference"}
    keys = [s.key for s in wl.streams]
    compared = equal = uncompared = unfounded = 0
    divergence = []
    moving = unreproducible_blocks(wl, blocks) if ref == wl.reference else set()
    for i, (r, e) in enumerate(zip(raw, ref_raw)):
        if not (e and e.get("status") == "ok"):
            uncompared += ok[i]
            continue
        if blocks[i].get("block", i) in moving:  # the reference moves: no result
            unfounded += ok[i]
            continue
        compared += 1
        same = ok[i] and all(r.get(k) is not None and r.get(k) == e.get(k) for k in keys)
        equal += same
        if ok[i] and not same:
            d = first_divergence(wl, r, e) or {}
            divergence.append({"block": blocks[i].get("block", i), **d})
    out: dict[str, Any] = {
        # a block whose reference moved gives no result: nothing there is exact
        "exact": compared > 0 and equal == compared and not unfounded,
        "exact_blocks": f"{equal}/{compared}",
    }
    if uncompared:
        out["exact_note"] = f"{uncompared} block(s) without a {ref} result to compare"
    if unfounded:
        out["exact_note"] = (
            f"{unfounded} block(s) not compared: {ref} did not reproduce itself there "
            "(reference_check)"
        )
    if divergence:
        out["first_divergence"] = divergence
    return out


def _status(rows: list[dict]) -> str:
    n_ok = sum(r["ok"] for r in rows)
    if n_ok:
        return "ok" if n_ok == len(rows) else "partial"
    bad = {r["status"] for r in rows}
    return "skipped" if bad and bad <= {"skipped", "missing"} else "failed"


def _errors(blocks: list, raw: list) -> list[dict]:
    return [
        {
            "block": b.get("block"),
            "status": (r or {}).get("status", "missing"),
            "error": (r or {}).get("error") or ("no result" if not r else None),
            **({"reason": r["reason"]} if r and r.get("reason") else {}),
        }
        for b, r in zip(blocks, raw)
        if not r or r.get("status") != "ok"
    ]


def aggregate(wl: Workload, blocks: Sequence[Mapping[str, Any]], cells: Sequence[str]) -> dict:
    """{cell: summary} across ``blocks`` (``{"block", "seed", "results": {cell: result}}``)."""
    blocks = list(blocks)
    names = list(dict.fromkeys([*cells, *wl.refs]))
    raw = {c: [(b.get("results") or {}).get(c) for b in blocks] for c in names}
    rows = {c: [block_row(wl, r) for r in raw[c]] for c in names}
    hashes = {s.key for s in wl.streams}
    numeric = [k for k in block_row(wl, {"status": "ok"}) if k not in ("ok", "status", *hashes)]
    table = pd.DataFrame(
        [{"cell": c, "i": i, **row} for c in names for i, row in enumerate(rows[c])],
        columns=["cell", "i", "ok", "status", *numeric],
    )
    table[numeric] = table[numeric].apply(pd.to_numeric, errors="coerce")
    medians = table[table.ok.astype(bool)].groupby("cell")[numeric].median()
    wide = {m: table.pivot(index="i", columns="cell", values=m) for m in RATIO_METRICS.values()}
    return {
        c: {**_cell_summary(wl, c, rows[c], medians, wide, raw, blocks), "per_block": rows[c]}
        for c in cells
    }


def _cell_summary(wl, c, rows, medians, wide, raw, blocks) -> dict:  # noqa: ANN001
    n_ok = sum(r["ok"] for r in rows)
    s: dict[str, Any] = {"status": _status(rows), "blocks_ok": f"{n_ok}/{len(rows)}"}
    for m in medians.columns:
        s[m] = _num(medians.loc[c, m]) if c in medians.index else None
    for st in wl.streams:
        by_block = [r.get(st.key) if r["ok"] else None for r in rows]
        s[st.key] = by_block[0] if by_block else None
        s[st.key + "_by_block"] = by_block
    ref = exact_reference(wl, c)
    s.update(exactness(wl, c, raw[c], raw.get(ref, [None] * len(raw[c])), blocks))
    if ref != wl.reference:
        s["exact_against"] = ref
    s["counts_as_result"] = s["status"] == "ok" and bool(s["exact"])
    busy, p50 = s.get("busy_ms"), s.get("p50_ms")
    s["wall_over_busy"] = p50 / busy if busy and p50 else None
    s["host_slack"] = 1.0 - busy / p50 if busy and p50 else None
    for ref in wl.refs:
        if c == ref:
            continue
        for name, m in RATIO_METRICS.items():
            s[f"{name}_vs_{ref}"] = paired_ratio(_col(wide[m], c), _col(wide[m], ref))
        s[f"speedup_vs_{ref}"] = paired_ratio(_col(wide["p50_ms"], ref), _col(wide["p50_ms"], c))
    s["replay"] = replay.summary(raw[c])
    s.update(wl.cell_summary(raw[c]))
    errors = _errors(blocks, raw[c])
    if errors:
        s["errors"] = errors
        why = [e.get("reason") or e.get("error") for e in errors]
        s["reason"] = next((w for w in why if w), None)
    return s


def _col(wide: pd.DataFrame, cell: str) -> list:
    return list(wide[cell]) if cell in wide.columns else []


def rotate(cells: Sequence[str], k: int) -> list[str]:
    """Cell order of block ``k``: the list rotated left by ``k`` (a cyclic Latin square)."""
    k %= len(cells) or 1
    return [*cells[k:], *cells[:k]]
