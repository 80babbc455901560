"""Human and machine views of an analysis: rich tables, their legend, a JSON-ready dict."""

from __future__ import annotations

import io

from rich.console import Console
from rich.table import Table

from duplexcadence.compiler.analysis import Analysis

MIB = 2**20

LEGEND = """\
legend:
  s          attended stride: frames the attended extent grows per call (a stepped
             clock's amounts, lo..hi or {a, b}: it grows by any one of them)
  W          attended window A - A-: from the first attended extent A- to the retained one A
  attended   the attended extents A-, A- + s, ..., A (what consumers read; fixes signatures)
  K          attended extents of a region, ceil(W / s) + 1 (1 when the extent never moves;
             stepped: 1 + the sums of amounts below W, counted in closed form)
  +S spec    speculative: a call may write S entries past the committed end (cut
             back by moving it); the envelope holds them
  rho        over-reservation: stock bytes / demand bytes
  |Q|        distinct signatures over the callable's configurations (flags, lengths, slots)
  bound      |Q| * product of K over its regions (Criterion 3.5)
  width      catalog classes: joint extents x admitted signatures (the graphs captured)
  reserve    replay reserve (eq. 6): staging of tensor arguments over all classes
             + the envelopes of write-through regions"""


# Fields only a batched contract has (compiler/batch_rules.py): left out of the JSON of
# any other, so its document is what it was before lockstep existed.
_BATCH_ONLY = {
    "batch_widths": True,
    "regions": {"__all__": {"slot", "slot_bytes", "batch_bytes"}},
    "callables": {
        "__all__": {"batch_widths", "batch_axis", "batch_rows", "batch_blocks", "graphs"}
    },
}


def analysis_json(a: Analysis) -> dict:
    # a contract without channels (or lockstep) documents what it did before they existed
    exclude = {} if a.batched else dict(_BATCH_ONLY)
    if not a.channels:
        exclude["channels"] = True
    return a.model_dump(mode="json", exclude=exclude or None)


def analysis_tables(a: Analysis, *, width: int = 120) -> str:
    buf = io.StringIO()
    console = Console(file=buf, width=width, color_system=None, force_terminal=False, markup=False)
    regions = Table(title=f"{a.contract}: regions (memory plan)", title_justify="left")
    for col in (
        "region",
        "shape",
        "retention",
        "s",
        "W",
        "attended",
        "K",
        "demand MiB",
        "stock MiB",
        "rho",
    ):
        regions.add_column(
            col, justify="right" if col not in ("region", "retention", "shape") else "left"
        )
    for r in a.regions:
        if r.bound is None:
            attended = ""
        elif r.catalog_width <= 6:
            attended = ", ".join(map(str, r.attended))
        else:  # closed form: listing is bounded (attended may be empty past LIST_LIMIT)
            attended = f"{r.start}..{r.bound} by {r.steps or r.stride}"
        regions.add_row(
            r.name,
            "x".join(map(str, r.shape)),
            (r.retention or "-") + (f" +{r.speculative} spec" if r.speculative else ""),
            r.steps or str(r.stride),
            str(r.window),
            attended or "-",
            str(r.catalog_width),
            f"{r.demand_bytes / MIB:.1f}",
            f"{r.stock_bytes / MIB:.1f}" if r.stock_bytes else "-",
            f"{r.rho:.2f}" if r.rho else "-",
        )
    console.print(regions)
    calls = Table(
        title=f"{a.contract}: callables (catalog, budget {a.budget})", title_justify="left"
    )
    for col in ("callable", "|Q|", "K per region", "bound", "width", "scope"):
        calls.add_column(col)
    for k in a.callables:
        parts = [", ".join(f"{r}={w}" for r, w in k.region_widths)]
        # a slot index `region r[i]` is a config variable: counted in |Q|, shown here
        by_var: dict[tuple[str, int], list[str]] = {}
        for r, i, n in k.slots:
            by_var.setdefault((i, n), []).append(r)
        parts += [f"{i}: {n} slots of {', '.join(rs)} (in |Q|)" for (i, n), rs in by_var.items()]
        if k.ambient_states > 1:
            parts.append(f"x {k.ambient_states} ambient states")
        widths = "; ".join(p for p in parts if p) or "-"
        scope = "replay" if k.in_scope else f"eager: {k.scope_reason}"
        calls.add_row(k.name, str(k.q_size), widths, str(k.bound), str(k.width), scope)
    console.print(calls)
    if a.batched:
        for table in _lockstep_tables(a):
            console.print(table)
    console.print(
        f"planned {a.demand_bytes / MIB:.1f} MiB vs stock {a.stock_bytes / MIB:.1f} MiB; "
        f"replay reserve (eq. 6) {a.reserve_bytes / MIB:.1f} MiB"
    )
    return buf.getvalue()


def _lockstep_tables(a: Analysis) -> tuple[Table, Table]:
    """A batched contract's lockstep: per batched callable its widths, axis, graphs (one
    per class and width) and per-row ops; per slotted region one session's bytes (a
    slot) and the bytes at the largest width (that many slots)."""
    widest = max(a.batch_widths)
    calls = Table(
        title=f"{a.contract}: lockstep (batched callables)",
        title_justify="left",
    )
    for col in ("callable", "widths", "axis", "graphs", "per row"):
        calls.add_column(col)
    for k in a.callables:
        if k.batch_widths:
            calls.add_row(
                k.name,
                ", ".join(map(str, k.batch_widths)),
                str(k.batch_axis),
                f"{k.width} x {len(k.batch_widths)} = {k.graphs}",
                k.rows_shown(),
            )
    slots = Table(
        title=f"{a.contract}: slotted regions",
        title_justify="left",
    )
    for col in ("region", "slot", "per slot MiB", f"at width {widest} MiB"):
        slots.add_column(col, justify="left" if col == "region" else "right")
    for r in a.regions:
        if r.slot is not None:
            slots.add_row(
                r.name, str(r.slot), f"{r.slot_bytes / MIB:.2f}", f"{r.batch_bytes / MIB:.2f}"
            )
    return calls, slots


def catalog_and_session(a: Analysis, per_session_bytes: int) -> str:
    """What `clockc check` says before any GPU work: each callable's catalog (the classes
    bind() captures, in order) and the bytes a session keeps (compiler/plan.py)."""
    lines = [f"{a.contract}: catalog (classes captured, in order)"]
    for k in a.callables:
        if not k.in_scope:
            lines.append(f"  {k.name}: eager ({k.scope_reason})")
            continue
        labels = "; ".join(c.label() for c in k.classes) if k.enumerated else "(not enumerated)"
        lines.append(f"  {k.name}: {k.width} class{'es' if k.width != 1 else ''}: {labels}")
        if k.batch_widths:  # each class is captured once per width
            widths = ", ".join(map(str, k.batch_widths))
            lines.append(
                f"    batched at widths {widths} on axis {k.batch_axis}: {k.graphs} graphs; "
                f"per row: {k.rows_shown()}"
            )
    lines.append(
        f"{a.contract}: {per_session_bytes:,} bytes per session (regions of lifetime turn "
        "or session)"
    )
    for ch in a.channels:
        lines.append(
            f"{a.contract}: channel {ch.name}: {ch.capacity} x {ch.dtype} ({ch.host_bytes:,} "
            f"bytes of host memory for each producer run), published {ch.batch} at a time, read "
            f"per {ch.clock}"
        )
    if a.batched:
        widest = max(a.batch_widths)
        slotted = sum(r.batch_bytes or 0 for r in a.regions)
        lines.append(
            f"{a.contract}: {slotted:,} bytes of slotted regions at batch width {widest} "
            f"({widest} sessions in lockstep, one slot each)"
        )
    return "\n".join(lines)


def params_text(summary: dict, footprints: dict | None = None) -> str:
    """Session parameters: catalog width and bytes per session at each folded value
    (both ends of every domain, its default and its capture values), and what is
    allocated: a session its own value's regions, a lane the largest value it serves
    (at bind the default and the capture values; it grows when a larger one comes).
    `footprints`: label -> compiler/plan.Footprint at that value (`clockc plan`)."""
    lines = []
    for p in summary["params"]:
        unit = f" {p['unit']}" if p["unit"] else ""
        lines.append(
            f"param {p['name']} in {p['lo']}..{p['hi']}{unit}: default {p['default']}, "
            f"captured at bind {p['capture'] or '-'}, hold {p['hold'] or 'all'}"
        )
    for label, row in summary["points"].items():
        widths = ", ".join(f"{k}={w}" for k, w in row["widths"].items())
        text = (
            f"  at {label:<16} catalog {widths}; demand {row['demand_bytes'] / MIB:.1f} MiB, "
            f"per session {row['per_session_bytes'] / MIB:.1f} MiB"
        )
        if footprints is not None:
            text += f", per lane {footprints[label].per_lane_bytes / MIB:.1f} MiB"
        lines.append(text)
    lines.append(
        "  allocated: a session its own value's regions (per session above); a lane "
        f"{summary['lane_at_bind_bytes'] / MIB:.1f} MiB of regions at bind (the default and "
        f"the capture values), growing to a larger value's shapes when it serves one: "
        f"{summary['allocated_bytes'] / MIB:.1f} MiB at the top of the domain "
        f"({summary['allocated_per_session_bytes'] / MIB:.1f} MiB per session there)"
    )
    for region, terms in summary["extent_shift"].items():
        moved = " + ".join(f"{c}·Δ{p}" for p, c in terms)
        lines.append(f"  {region}: attended extents move by {moved}")
    for region, dims in summary["shape_shift"].items():
        moved = "; ".join(
            f"dim {i} by " + " + ".join(f"{c}·Δ{p}" for p, c in terms) for i, terms in dims.items()
        )
        lines.append(f"  {region}: allocated shape moves: {moved}")
    return "\n".join(lines)
