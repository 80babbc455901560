"""Markdown table and PNG plot of a ``bench.token2wav`` result document."""

from __future__ import annotations

from pathlib import Path
from typing import Any

REF = "B0"


def _f(v: Any, fmt: str = "{:.1f}") -> str:
    if v is None:
        return "–"
    try:
        return fmt.format(v)
    except (TypeError, ValueError):
        return str(v)


def _ratio(r: dict | None, fmt: str = "{:.2f}") -> str:
    if not r:
        return "–"
    s = _f(r["geomean"], fmt) + "×"
    if r.get("ci95"):
        s += f" [{_f(r['ci95'][0], fmt)}, {_f(r['ci95'][1], fmt)}]"
    return s


def _replay(c: dict) -> str:
    rep = c.get("replay")
    if not rep:
        return "–"
    parts = []
    for name, c in (rep.get("callables") or {}).items():
        misses = c.get("window_misses") or {}
        m = ", ".join(f"{k} {v}" for k, v in sorted(misses.items())) or "0"
        parts.append(f"{name} {c.get('window_hits', 0)} / {m}")
    return "; ".join(parts) or "–"


def _exact(name: str, c: dict) -> str:
    if name == REF:
        return "ref" if c.get("exact") else "no"
    if c.get("exact"):
        return "yes"
    return f"**NO** ({c.get('exact_blocks', '?')})"


def _ci_note(doc: dict) -> str:
    for n, c in doc.get("cells", {}).items():
        r = c.get("speedup_vs_" + REF) if n != REF else None
        if r:
            return "95% CI: " + r["ci_method"]
    return "no paired ratio"


def markdown(doc: dict) -> str:
    s = doc.get("settings", {})
    det = doc.get("determinism", {})
    calls = doc.get("calls") or []
    if len(calls) > 1:
        head = [f"- {len(calls)} calls merged into this document (blocks paired across calls):"]
        for c in calls:
            head.append(
                f"  - call {c.get('index', '?')}: `{c.get('command')}` — git `{c.get('git_commit')}`"
                + (" (dirty tree)" if c.get("git_dirty") else "")
                + (f", hosts {', '.join(c['hosts'])}" if c.get("hosts") else "")
                + (f", {c['wall_s']:.0f} s" if c.get("wall_s") is not None else "")
                + (f", {len(c['skipped'])} worker(s) not launched" if c.get("skipped") else "")
            )
    else:
        head = [
            f"- command: `{doc.get('command')}`",
            f"- git commit: `{doc.get('git_commit')}`"
            + (" (dirty tree)" if doc.get("git_dirty") else ""),
        ]
    lines = [
        "# Token2Wav streaming benchmark (minicpmo-utils 1.0.6, seeded random weights, fp32, batch 1)",
        "",
        *head,
        f"- torch {doc.get('torch')}, CUDA {doc.get('cuda')}, cuDNN {doc.get('cudnn')}, "
        f"device {doc.get('gpu')}, Python {doc.get('python')}",
        f"- determinism envelope in every cell: "
        + ", ".join(f"{k}={v}" for k, v in (det.get("envelope") or {}).items())
        + f" (read back in every worker: {det.get('held_in_every_worker')})",
        f"- {s.get('blocks')} block(s) × {s.get('chunks')} measured chunks after {s.get('warmup')} "
        f"warm-up; split pass {s.get('split_chunks')} chunks, profiler pass {s.get('profile_chunks')} "
        f"chunks; seeds {s.get('block_seeds')}; every (block, cell) in a fresh process",
        "",
        "| cell | exact | p50 ms | p95 ms | speedup vs B0 [95% CI] | busy ms | wall/busy | kernels/chunk "
        "| launch calls/chunk | flow ms | vocoder ms | peak MiB | peak vs B0 [95% CI] | window peak MiB "
        "| window peak vs B0 | replay hits / misses in window | setup s (capture s) |",
        "|---|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---|---|---:|",
    ]
    notes = []
    for name, c in doc.get("cells", {}).items():
        status = c.get("status")
        if status in ("not implemented", "not run", "skipped"):
            notes.append(f"- **{name}** ({status}): {c.get('what')} — {c.get('reason')}")
            continue
        if status == "failed":
            errs = "; ".join(
                f"block {e['block']} {e.get('status')}: {e.get('error')}"
                for e in c.get("errors", [])
            )
            lines.append(f"| {name} | failed | " + " | ".join(["–"] * 15) + " |")
            notes.append(f"- **{name}** failed ({c.get('reason')}): {errs}")
            continue
        inexact = name != REF and not c.get("exact")
        launches = c.get("kernel_launch_calls_per_chunk")
        graphs = c.get("graph_launch_calls_per_chunk")
        lc = _f(launches, "{:.0f}")
        if graphs:
            lc += f" + {graphs:.0f} graph"
        rep = c.get("replay") or {}
        lines.append(
            "| "
            + " | ".join(
                [
                    name + (" (partial)" if status == "partial" else ""),
                    _exact(name, c),
                    _f(c.get("p50_ms")),
                    _f(c.get("p95_ms")),
                    (
                        "1 (ref)"
                        if name == REF
                        else _ratio(c.get("speedup_vs_" + REF)) + (" †" if inexact else "")
                    ),
                    _f(c.get("busy_ms")),
                    _f(c.get("wall_over_busy"), "{:.2f}"),
                    _f(c.get("kernels_per_chunk"), "{:.0f}"),
                    lc,
                    _f(c.get("flow_ms")),
                    _f(c.get("vocoder_ms")),
                    _f(c.get("peak_mib"), "{:.0f}"),
                    "1 (ref)" if name == REF else _ratio(c.get("peak_ratio_vs_" + REF), "{:.3f}"),
                    _f(c.get("window_peak_mib"), "{:.0f}"),
                    (
                        "1 (ref)"
                        if name == REF
                        else _ratio(c.get("window_peak_ratio_vs_" + REF), "{:.3f}")
                    ),
                    _replay(c),
                    _f(c.get("setup_s"), "{:.2f}")
                    + (f" ({_f(rep.get('capture_s'), '{:.2f}')})" if rep else ""),
                ]
            )
            + " |"
        )
        if status == "partial":
            errs = "; ".join(
                f"block {e['block']} {e.get('status')}: {e.get('error')}"
                for e in c.get("errors", [])
            )
            notes.append(f"- **{name}** partial ({c.get('blocks_ok')} blocks): {errs}")
        if inexact:
            notes.append(
                f"- **{name}** is not bit-exact vs B0 ({c.get('exact_blocks')} blocks equal): "
                "not a result (its speedup is marked †)."
            )
        vg = c.get("vendor_graphs")
        if vg:
            notes.append(
                f"- **{name}** vendor DiT graphs: buckets {vg.get('buckets')} (max attended "
                f"cache {vg.get('max_size')}); {vg.get('bucket_replays')} graph replays of "
                f"{vg.get('estimator_calls')} estimator calls over {vg.get('blocks')} block(s)."
            )
        cp = c.get("compile")
        if cp:
            notes.append(
                f"- **{name}** torch.compile {cp.get('compile_kwargs')}: compile + first calls "
                f"{_f(cp.get('compile_and_first_calls_s'))} s (median; outside the window), "
                f"{_f(cp.get('frames_compiled'), '{:.0f}')} frames compiled, "
                f"{_f(cp.get('graph_breaks'), '{:.0f}')} graph breaks, "
                f"{cp.get('frames_compiled_in_window')} frames compiled inside the window."
            )
    lines.append("")
    lines.append(
        "PCM SHA-256 (block 0): "
        + ", ".join(
            f"{n} `{str(c.get('pcm_sha256'))[:16]}`"
            for n, c in doc.get("cells", {}).items()
            if c.get("status") in ("ok", "partial")
        )
    )
    lines.append("")
    method = doc.get("method", {})
    lines.append(
        "p50/p95: per-block median / 95th percentile of the window's synchronised per-chunk wall "
        "time, then the median over blocks. Ratios: per-block paired, geometric mean, "
        + _ci_note(doc)
        + ". busy: profiler kernel-time sum per chunk (separate pass); wall/busy = p50 / busy. "
        "flow/vocoder: separate synchronised pass. peak: process max_memory_allocated."
    )
    if notes:
        lines += ["", *notes]
    return "\n".join(lines) + "\n"


def plot(doc: dict, path: Path) -> str | None:
    """Write the PNG; returns None, or a note saying why no plot was written."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "(no PNG: matplotlib is not installed)"
    cells = [
        (n, c)
        for n, c in doc.get("cells", {}).items()
        if c.get("status") in ("ok", "partial") and c.get("p50_ms") is not None
    ]
    if not cells:
        return "(no PNG: no cell produced numbers)"
    names = [n for n, _ in cells]
    x = range(len(names))
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(max(8, 1.6 * len(names) + 4), 4.2))
    colors = ["#4c72b0" if (n == REF or c.get("exact")) else "#c44e52" for n, c in cells]

    def errs(key: str) -> list[list[float]]:
        lo, hi = [], []
        for _, c in cells:
            vals = [
                r.get(key) for r in c.get("per_block", []) if r.get("ok") and r.get(key) is not None
            ]
            mid = c.get(key) or 0.0
            lo.append(mid - min(vals) if vals else 0.0)
            hi.append(max(vals) - mid if vals else 0.0)
        return [lo, hi]

    p50 = [c["p50_ms"] for _, c in cells]
    ax1.bar(x, p50, color=colors, yerr=errs("p50_ms"), capsize=4)
    busy = [c.get("busy_ms") for _, c in cells]
    if any(b is not None for b in busy):
        ax1.scatter(
            [i for i, b in zip(x, busy) if b is not None],
            [b for b in busy if b is not None],
            marker="_",
            s=600,
            color="black",
            zorder=3,
            label="device-busy (profiler)",
        )
        ax1.legend(loc="upper left", fontsize=8, framealpha=0.9)
    ax1.set_ylim(0, max(p50) * 1.25)
    for i, v in zip(x, p50):
        ax1.annotate(f"{v:.0f}", (i, v), ha="center", va="bottom", fontsize=8)
    ax1.set_xticks(list(x), names, rotation=20)
    ax1.set_ylabel("per-chunk wall p50 (ms)")
    ax1.set_title("latency (bars: median over blocks; whiskers: block range)", fontsize=9)
    peaks = [c.get("peak_mib") for _, c in cells]
    wpeaks = [c.get("window_peak_mib") for _, c in cells]
    if any(p is not None for p in peaks):
        xl = [i - 0.2 for i in x]
        xr = [i + 0.2 for i in x]
        ax2.bar(
            xl,
            [p or 0.0 for p in peaks],
            width=0.4,
            color=colors,
            yerr=errs("peak_mib"),
            capsize=3,
            label="process peak",
        )
        ax2.bar(
            xr,
            [p or 0.0 for p in wpeaks],
            width=0.4,
            color=colors,
            alpha=0.45,
            hatch="//",
            label="peak in measured window",
        )
        for i, v in zip(xl, peaks):
            if v is not None:
                ax2.annotate(f"{v:.0f}", (i, v), ha="center", va="bottom", fontsize=7)
        for i, v in zip(xr, wpeaks):
            if v is not None:
                ax2.annotate(f"{v:.0f}", (i, v), ha="center", va="bottom", fontsize=7)
        ax2.set_ylim(0, max(p or 0.0 for p in peaks) * 1.25)
        ax2.legend(loc="upper left", fontsize=8, framealpha=0.9)
        ax2.set_ylabel("torch.cuda.max_memory_allocated (MiB)")
        ax2.set_title("memory", fontsize=9)
    else:
        ax2.text(
            0.5,
            0.5,
            "no CUDA memory statistics\n(device: cpu)",
            ha="center",
            va="center",
            transform=ax2.transAxes,
        )
        ax2.set_axis_off()
    ax2.set_xticks(list(x), names, rotation=20)
    fig.suptitle(f"Token2Wav streaming, {doc.get('gpu')} — red: not bit-exact vs B0", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return None
