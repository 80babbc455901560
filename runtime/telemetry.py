"""Telemetry: the one logger and the printable report.

Contract of this layer: everything the runtime says goes through the logger named
``"duplexcadence"`` (configure it like any other ``logging`` logger), and
``format_report`` renders the ``stats()`` dicts of replays and regions as plain
text tables (rich, no colour codes, so it pastes into issues and CI logs). The
dicts themselves are the machine-readable form.
"""

from __future__ import annotations

import io
import logging
from typing import Iterable

LOGGER = logging.getLogger("duplexcadence")

_MIB = 1024 * 1024


def _mib(n: int | None) -> str:
    return "-" if n is None else f"{n / _MIB:.2f}"


def merge_lane_stats(per_lane: list[dict]) -> dict:
    """One callable's ``stats()`` over every lane it has: counters and costs added up,
    misses merged, every lane's classes with their hits added up by class."""
    if len(per_lane) == 1:
        return per_lane[0]
    out = dict(per_lane[0])
    for key in (
        "hits",
        "calls",
        "eager_calls",
        "invalidations",
        "warmup_s",
        "capture_s",
        "staging_bytes",
    ):
        out[key] = sum(s[key] for s in per_lane)
    for key in ("capture_allocated_bytes", "capture_reserved_bytes"):
        vals = [s[key] for s in per_lane if s[key] is not None]
        out[key] = sum(vals) if vals else None
    misses: dict[str, int] = {}
    details: dict[str, str] = {}
    for s in per_lane:
        for reason, n in s["misses"].items():
            misses[reason] = misses.get(reason, 0) + n
        for reason, text in s["miss_details"].items():
            details.setdefault(reason, text)
    out["misses"], out["miss_details"] = misses, details
    out["miss_log"] = [dict(m, lane=i) for i, s in enumerate(per_lane) for m in s["miss_log"]]
    # by name (and session-parameter value): lanes at different values hold different
    # classes (params.py); with one value every lane lists the same classes
    classes: dict[tuple, dict] = {}
    for s in per_lane:
        for c in s["classes"]:
            key = (c["name"], c.get("params"))
            if key in classes:
                classes[key]["hits"] += c["hits"]
            else:
                classes[key] = dict(c)
    out["classes"] = list(classes.values())
    out["lanes"] = len(per_lane)
    return out


def format_report(items: Iterable[object], width: int = 120) -> str:
    """Render replays and regions (anything with ``.stats()``) as text tables: one of
    the replays, one of each replay's classes, one of the regions."""
    from rich.console import Console

    stats = [it.stats() if hasattr(it, "stats") else dict(it) for it in items]  # type: ignore[arg-type]
    replays = [s for s in stats if s.get("kind") == "replay"]
    regions = [s for s in stats if s.get("kind") in ("region", "carry")]
    buf = io.StringIO()
    console = Console(file=buf, width=width, force_terminal=False, color_system=None, markup=False)
    if replays:
        console.print(_replay_table(replays))
        for s in replays:
            if s["classes"]:
                console.print(_class_table(s))
    if regions:
        console.print(_region_table(regions))
        console.print(
            "retains: writebacks the region's retention ran (every eager call of a callable "
            "that retains it, capture's probe and warm-up calls, and under the simulated "
            "backend every replay too, which re-runs the body); adoptions: stock tensors "
            "copied in at an aliased argument"
        )
    return buf.getvalue()


def _table(title: str, columns: str, left: str):
    """A table drawn as `clockc check` draws its own (rich's default box); the columns
    named in ``left`` (``|``-separated, as ``columns``) are left-aligned, the others right."""
    from rich.table import Table

    t = Table(title=title, title_justify="left")
    for col in columns.split("|"):
        t.add_column(col, justify="left" if col in left.split("|") else "right")
    return t


def _replay_table(replays: list[dict]):
    t = _table(
        "exact-shape replay",
        "callable|effect|classes|hits|misses|invalid.|warm-up s|capture s|capture alloc MiB",
        left="callable|effect|misses",
    )
    for s in replays:
        misses = ", ".join(f"{k}={v}" for k, v in sorted(s["misses"].items())) or "0"
        captured = sum(1 for c in s["classes"] if c["status"] == "captured")
        t.add_row(
            s["name"],
            s["effect"] + (f" (rejected: {s['rejected']})" if s["rejected"] else ""),
            f"{captured}/{len(s['classes'])}",
            str(s["hits"]),
            misses,
            str(s["invalidations"]),
            f"{s['warmup_s']:.3f}",
            f"{s['capture_s']:.3f}",
            # allocated, not reserved: the caching allocator may release other blocks
            # while capturing, which makes a reserved delta negative
            _mib(s["capture_allocated_bytes"]),
        )
    return t


def _class_table(replay: dict):
    t = _table(
        f"{replay['name']}: classes",
        "class|status|hits|warm-up s|capture s|alloc MiB|reserved MiB",
        left="class|status",
    )
    # classes never captured where they were met (a value a pool's step ran eager on a
    # lane without its graphs) are counted in the callable's misses, not listed
    pending = [c for c in replay["classes"] if c["status"] == "pending"]
    if pending:
        t.caption = f"{len(pending)} class(es) of values run eager before their capture not listed"
    for c in replay["classes"]:
        if c["status"] == "pending":
            continue
        t.add_row(
            c["name"],
            c["status"],
            str(c["hits"]),
            f"{c['warmup_s']:.3f}",
            f"{c['capture_s']:.3f}",
            _mib(c["allocated_bytes"]),
            _mib(c["reserved_bytes"]),
        )
    return t


def _region_table(regions: list[dict]):
    t = _table(
        "regions",
        "region|shape|dtype|MiB|retention|retains|adoptions|audit div.",
        left="region|shape|dtype|retention",
    )
    for s in regions:
        t.add_row(
            s["name"],
            "x".join(map(str, s["shape"])),
            s["dtype"],
            _mib(s["nbytes"]),
            s.get("retention", "-"),
            str(s.get("retains", "-")),
            str(s.get("adoptions", "-")),
            "-" if not s.get("audit") else str(s["audit_divergences"]),
        )
    return t


def eager_by_design(callables: dict) -> bool:
    """True when no callable could ever replay here: every engine's backend can not
    capture on this device (a CPU binding without ``backend="simulate"``)."""
    return bool(callables) and all(
        s["rejected"] == "no_cuda" or (not s["captured"] and set(s["misses"]) <= {"no_cuda"})
        for s in callables.values()
    )


def replay_lines(callables: dict) -> list[str]:
    """Per callable: calls replayed out of calls made, then every logged miss with the
    argument leaf that kept it out of replay (``ExactShapeReplay.miss_log``)."""
    lines = []
    for name, s in callables.items():
        calls = s["calls"]
        rate = f" ({100 * s['hits'] / calls:.0f}%)" if calls else ""
        lines.append(f"  callable {name}: {s['hits']}/{calls} calls replayed{rate}")
        for m in s["miss_log"]:
            detail = f": {m['detail']}" if m["detail"] else ""
            lines.append(f"    call {m['call']} ran eager ({m['reason']}){detail}")
        shown = len(s["miss_log"])
        if s["eager_calls"] > shown:
            lines.append(f"    ... {s['eager_calls'] - shown} more eager calls, by reason above")
    return lines


def capture_summary(contract: str, device: object, callables: dict, eager: dict) -> str:
    """The one line bind() prints after capturing (stderr, unless ``progress=False``)."""
    entries = [c for s in callables.values() for c in s["classes"]]
    captured = sum(c["status"] == "captured" for c in entries)
    backends = sorted({s["backend"] for s in callables.values()}) or ["-"]
    seconds = sum(s["capture_s"] + s["warmup_s"] for s in callables.values())
    rejected = [f"{n} ({s['rejected']})" for n, s in callables.items() if s["rejected"]]
    tail = f"; rejected: {', '.join(rejected)}" if rejected else ""
    tail += f"; left eager: {', '.join(eager)}" if eager else ""
    return (
        f"duplexcadence: {contract} on {device} ({'/'.join(backends)}): captured "
        f"{captured}/{len(entries)} classes of {len(callables)} callables in {seconds:.2f} s"
        f"{tail}; binding.report() lists hits and misses"
    )
