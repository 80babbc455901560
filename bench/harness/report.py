"""The markdown table and the PNG of a result document, for any workload.

One table and one figure, parameterised by the workload's unit (``chunk``, ``frame``),
its reference cell, the cells ratios are taken against and its parts; the workload
adds its title, header lines and per-cell notes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from .workload import Workload

DASH = "–"
SHOWN = ("ok", "partial")


def _f(v: Any, fmt: str = "{:.1f}") -> str:
    try:
        return DASH if v is None else fmt.format(v)
    except (TypeError, ValueError):
        return str(v)


def _ratio(r: dict | None, fmt: str = "{:.2f}") -> str:
    ci = f" [{_f(r['ci95'][0], fmt)}, {_f(r['ci95'][1], fmt)}]" if r and r.get("ci95") else ""
    return _f(r["geomean"], fmt) + "×" + ci if r else DASH


def _replay(c: dict) -> str:
    parts = []
    for name, r in ((c.get("replay") or {}).get("callables") or {}).items():
        misses = ", ".join(f"{k} {v}" for k, v in sorted((r.get("window_misses") or {}).items()))
        parts.append(f"{name} {r.get('window_hits', 0)} / {misses or '0'}")
    return "; ".join(parts) or DASH


def _exact(wl: Workload, name: str, c: dict) -> str:
    if name == wl.reference:
        return "ref" if c.get("exact") else "no"
    return "yes" if c.get("exact") else f"**NO** ({c.get('exact_blocks', '?')})"


def _row(wl: Workload, name: str, c: dict) -> dict[str, str]:
    """One table row: {column: text}."""
    u, ref = wl.unit, wl.reference
    launches = _f(c.get(f"kernel_launch_calls_per_{u}"), "{:.0f}")
    if c.get(f"graph_launch_calls_per_{u}"):
        launches += f" + {c[f'graph_launch_calls_per_{u}']:.0f} graph"
    capture = (c.get("replay") or {}).get("capture_s")
    row = {
        "cell": name + (" (partial)" if c.get("status") == "partial" else ""),
        "exact": _exact(wl, name, c),
        "p50 ms": _f(c.get("p50_ms")),
        "p95 ms": _f(c.get("p95_ms")),
    }
    for r in wl.refs:
        mark = " †" if name != ref and not c.get("exact") else ""
        text = "1 (ref)" if name == r else _ratio(c.get(f"speedup_vs_{r}")) + mark
        row[f"speedup vs {r} [95% CI]"] = text
    row.update(
        {
            "busy ms": _f(c.get("busy_ms")),
            "wall/busy": _f(c.get("wall_over_busy"), "{:.2f}"),
            f"kernels/{u}": _f(c.get(f"kernels_per_{u}"), "{:.0f}"),
            f"launch calls/{u}": launches,
            **{f"{p} ms": _f(c.get(f"{p}_ms")) for p in wl.parts},
            "peak MiB": _f(c.get("peak_mib"), "{:.0f}"),
            f"peak vs {ref} [95% CI]": (
                "1 (ref)" if name == ref else _ratio(c.get(f"peak_ratio_vs_{ref}"), "{:.3f}")
            ),
            "window peak MiB": _f(c.get("window_peak_mib"), "{:.0f}"),
            f"window peak vs {ref}": (
                "1 (ref)" if name == ref else _ratio(c.get(f"window_peak_ratio_vs_{ref}"), "{:.3f}")
            ),
            "replay hits / misses in window": _replay(c),
            "setup s (capture s)": _f(c.get("setup_s"), "{:.2f}")
            + (f" ({capture:.2f})" if capture is not None else ""),
        }
    )
    if c.get("status") == "failed":
        row = {k: (v if k == "cell" else DASH) for k, v in row.items()} | {"exact": "failed"}
    return row


def _errs(c: dict) -> str:
    return "; ".join(
        f"block {e['block']} {e.get('status')}: {e.get('error')}" for e in c.get("errors", [])
    )


def _notes(wl: Workload, name: str, c: dict) -> list[str]:
    status = c.get("status")
    if status not in SHOWN and status != "failed":
        return [f"- **{name}** ({status}): {c.get('what')} — {c.get('reason')}"]
    notes = []
    if status == "failed":
        notes.append(f"- **{name}** failed ({c.get('reason')}): {_errs(c)}")
    if status == "partial":
        notes.append(f"- **{name}** partial ({c.get('blocks_ok')} blocks): {_errs(c)}")
    if status in SHOWN and name != wl.reference and not c.get("exact"):
        notes.append(
            f"- **{name}** is not bit-exact vs {wl.reference} ({c.get('exact_blocks')} blocks "
            f"equal; first divergence {c.get('first_divergence')}): not a result (marked †)."
        )
    return notes + wl.cell_notes(name, c)


def _header(wl: Workload, doc: dict) -> list[str]:
    s, det, calls = doc.get("settings", {}), doc.get("determinism", {}), doc.get("calls") or []
    u, n = wl.unit, wl.dests()
    if len(calls) > 1:
        lines = [f"- {len(calls)} calls merged into this document (blocks paired across calls):"]
        for c in calls:
            lines.append(
                f"  - call {c.get('index', '?')}: `{c.get('command')}` — git `{c.get('git_commit')}`"
                + (" (dirty tree)" if c.get("git_dirty") else "")
                + (f", hosts {', '.join(c['hosts'])}" if c.get("hosts") else "")
                + (f", {c['wall_s']:.0f} s" if c.get("wall_s") is not None else "")
                + (f", {len(c['skipped'])} worker(s) not launched" if c.get("skipped") else "")
            )
    else:
        dirty = " (dirty tree)" if doc.get("git_dirty") else ""
        lines = [
            f"- command: `{doc.get('command')}`",
            f"- git commit: `{doc.get('git_commit')}`{dirty}",
        ]
    passes = (f"; split pass {s.get(n['split'])} {u}s" if "split" in n else "") + (
        f"; profiler pass {s.get(n['profile'])} {u}s"
    )
    stop = doc.get("budget_stop")
    return lines + [
        f"- torch {doc.get('torch')}, CUDA {doc.get('cuda')}, cuDNN {doc.get('cudnn')}, "
        f"device {doc.get('gpu')}, Python {doc.get('python')}",
        *wl.describe(doc),
        "- determinism envelope in every cell: "
        + ", ".join(f"{k}={v}" for k, v in (det.get("envelope") or {}).items())
        + f" (read back in every worker: {det.get('held_in_every_worker')})",
        _reference_line(wl, doc.get("reference_check") or {}),
        f"- {s.get('blocks')} block(s) × {s.get(n['window'])} measured {u}s after "
        f"{s.get('warmup')} warm-up{passes}; seeds {s.get('block_seeds')}; every (block, cell) "
        "in a fresh process"
        + ("" if doc.get("complete", True) else "; **incomplete run**")
        + (f"; --time-budget skipped workers: {stop}" if stop else ""),
    ]


def markdown(wl: Workload, doc: dict) -> str:
    cells = doc.get("cells", {})
    rows = [_row(wl, n, c) for n, c in cells.items() if c.get("status") in (*SHOWN, "failed")]
    table = pd.DataFrame(rows)
    numeric = (" ms", " MiB", "wall/busy", f"/{wl.unit}", "(capture s)")  # right-aligned
    align = ["right" if col.endswith(numeric) else "left" for col in table.columns]
    shas = "; ".join(
        f"{n} " + " / ".join(f"`{str(c.get(s.key))[:16]}`" for s in wl.streams)
        for n, c in cells.items()
        if c.get("status") in SHOWN
    )
    lines = [f"# {wl.title(doc)}", "", *_header(wl, doc), ""]
    if rows:
        lines += [table.to_markdown(index=False, colalign=align, disable_numparse=True), ""]
    streams = " / ".join(s.name for s in wl.streams)
    lines += [f"SHA-256 of {streams} (block 0): {shas}", "", "Method:"]
    lines += [f"- {k}: {v}" for k, v in (doc.get("method") or {}).items()]
    notes = [line for n, c in cells.items() for line in _notes(wl, n, c)]
    return "\n".join(lines + ([""] + notes if notes else [])) + "\n"


def plot(wl: Workload, doc: dict, path: Path) -> None:
    """Latency (p50 with the block range, p95 hatched, device-busy marks) and memory
    (process peak, window peak hatched) per cell; red: not bit-exact."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = {n: c for n, c in doc.get("cells", {}).items() if c.get("status") in SHOWN}
    cells = {n: c for n, c in cells.items() if c.get("p50_ms") is not None}
    df = pd.DataFrame.from_dict(cells, orient="index")
    colors = ["#4c72b0" if n == wl.reference or c["exact"] else "#c44e52" for n, c in cells.items()]
    fig, axes = plt.subplots(1, 2, figsize=(max(9, 1.6 * len(cells) + 4), 4.2))
    panels = (
        (("p50_ms", "p95_ms"), f"per-{wl.unit} wall (ms)", "latency (median over blocks)"),
        (("peak_mib", "window_peak_mib"), "max_memory_allocated (MiB)", "memory: process / window"),
    )
    for ax, (keys, ylabel, title) in zip(axes, panels):
        if df.empty or keys[0] not in df or df[keys[0]].isna().all():
            ax.text(0.5, 0.5, "no numbers (memory: CUDA only)", ha="center", transform=ax.transAxes)
            ax.set_axis_off()
            continue
        for k, key in enumerate(keys):
            x = [i - 0.2 + 0.4 * k for i in range(len(df))]
            bars = ax.bar(
                x,
                df[key].fillna(0.0),
                width=0.4,
                color=colors,
                alpha=1 - 0.55 * k,
                hatch="//" if k else None,
                yerr=_block_range(cells, key) if k == 0 else None,
                capsize=3,
                label=key,
            )
            ax.bar_label(bars, fmt="%.0f", fontsize=7)
        if keys[0] == "p50_ms" and "busy_ms" in df and df.busy_ms.notna().any():
            ax.scatter(range(len(df)), df.busy_ms, marker="_", s=600, color="k", label="busy_ms")
        if keys[0] == "p50_ms" and wl.deadline_ms:
            ax.axhline(wl.deadline_ms, color="grey", lw=0.8, ls="--", label=f"{wl.unit} period")
        ax.set_xticks(range(len(df)), list(df.index), rotation=20)
        ax.set(ylabel=ylabel, title=title)
        ax.legend(fontsize=7, framealpha=0.9)
    fig.suptitle(
        f"{wl.name} per {wl.unit}, {doc.get('gpu')} — red: not bit-exact vs {wl.reference}"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _block_range(cells: dict, key: str) -> list[list[float]]:
    """Whiskers from the median over blocks to the lowest and highest block."""
    lo, hi = [], []
    for c in cells.values():
        vals = [r[key] for r in c.get("per_block", []) if r.get("ok") and r.get(key) is not None]
        mid = c.get(key) or 0.0
        lo.append(mid - min(vals) if vals else 0.0)
        hi.append(max(vals) - mid if vals else 0.0)
    return [lo, hi]


def _reference_line(wl: Workload, check: dict) -> str:
    """Whether the reference reproduced itself (stats.reference_check)."""
    if not check.get("blocks_checked"):
        return f"- reference {wl.reference} reproducible: **unchecked** (no second run)"
    bad = [b for b in check["per_block"] if not b["reproducible"]]
    if not bad:
        return (
            f"- reference {wl.reference} reproducible: yes, a second fresh run equal over all "
            f"{check.get('steps')} {wl.unit}s in {check['blocks_checked']} block(s)"
        )
    where = "; ".join(f"block {b['block']}: {b['divergence']}" for b in bad)
    return f"- reference {wl.reference} reproducible: **NO** ({where}); no cell is exact against it"
