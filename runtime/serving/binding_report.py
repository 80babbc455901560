"""What ``Binding.stats()`` and ``Binding.report()`` say (binding.py): every lane's
engine counters merged by callable, the regions, constants and folds, sessions, and
session-parameter values held, captured and evicted."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..telemetry import eager_by_design, format_report, merge_lane_stats, replay_lines

if TYPE_CHECKING:
    from .binding import Binding


def binding_stats(b: Binding) -> dict:
    """``Binding.stats()``."""
    per_lane = [lane.engine_stats() for lane in b.lanes]
    return {
        "contract": b.contract,
        "device": str(b.device),
        "determinism": b.determinism,
        "callables": {
            name: merge_lane_stats([lane[name] for lane in per_lane])
            for name in (per_lane[0] if per_lane else {})
        },
        "lanes": len(b.lanes),
        "eager": dict(b.eager),
        "declared": dict(b.declared),
        "regions": {name: _region_stats(r) for name, r in b.regions.items()},
        "constants": dict(b.constants),
        "folds": {f.name: f.stats() for f in b.folds},
        "site_rebinds": b.site_rebinds,
        "sessions": None if b.pool is None else b.pool.stats(),
        "lockstep": None if b.lockstep_pool is None else b.lockstep_pool.stats(),
        "params": _params_stats(b),
        "batch": _batch_stats(b),
    }


def binding_report(b: Binding, width: int = 120) -> str:
    """Regions, replays (hits, misses by reason, capture cost) and constants as text."""
    lanes = f", {len(b.lanes)} lanes" if len(b.lanes) > 1 else ""
    lines = [f"duplexcadence binding of contract {b.contract} on {b.device}{lanes}"]
    merged = b.stats()["callables"]
    if eager_by_design(merged):
        # not a failure: say so instead of printing 0/N classes and miss counters
        lines.append(
            f"  no CUDA: eager by design: every call runs the stock code on {b.device} "
            '(bind(..., backend="simulate") runs the replay policy here and reports it)'
        )
        for name, s in merged.items():
            lines.append(f"  callable {name}: {s['calls']} calls, eager")
        lines.append(format_report(list(b.regions.values()), width=width))
    else:
        lines.append(format_report([*merged.values(), *b.regions.values()], width=width))
        lines.extend(replay_lines(merged))
    for name, why in b.eager.items():
        lines.append(f"  callable {name}: eager ({why})")
    for name, what in b.constants.items():
        lines.append(f"  constant {name}: {what}")
    lines.extend(f.report_line() for f in b.folds)
    for ch in b.decl.channels:  # opened per producer run: Channel(DECLARED.channel(name), device)
        lines.append(
            f"  channel {ch.name}: {ch.capacity} x {ch.dtype}, published up to {ch.batch} at a "
            f"time, readiness recorded per {ch.clock}"
        )
    for name, why in b.declared.items():
        lines.append(f"  region {name}: {why}")
    batch = _batch_stats(b)
    if batch is not None:
        rows = "; ".join(
            f"{name}: {', '.join(ops) if ops else 'none'}" for name, ops in batch["rows"].items()
        )
        lines.append(
            f"  lockstep: {batch['width']} sessions per call (declared widths "
            f"{', '.join(map(str, batch['widths']))}); ops per row: {rows}"
            + (f" (blocks on {batch['row_streams']} side streams)" if batch["row_streams"] else "")
        )
        lines.append(_proof_line(batch["proof"]))
    params = _params_stats(b)
    if params is not None:
        held = "; ".join(", ".join(s["held"]) for s in params["lanes"])
        lines.append(
            f"  session parameters: graphs of {', '.join(params['per_value'])} per value; "
            f"held {held}; {params['captures']} value capture(s) in "
            f"{params['capture_s']:.2f} s, {params['evictions']} eviction(s), "
            f"{params['regrows']} regrow(s) in {params['regrow_s']:.2f} s"
        )
    for pool in (b.pool, b.lockstep_pool):
        if pool is not None:
            lines.append(pool.report())
    return "\n".join(lines)


def _params_stats(b: Binding) -> dict | None:
    """Values bound, graphs per value held and evicted, capture cost (params.py)."""
    if b.decl is None or not b.decl.params:
        return None
    lanes = [lane.values.stats() for lane in b.lanes]
    return {
        "declared": [
            {"name": p.name, "lo": p.lo, "hi": p.hi, "default": p.default, "capture": p.capture}
            for p in b.decl.params
        ],
        "per_value": sorted(b.lanes[0]._per_value),
        "captures": sum(s["captures"] for s in lanes),
        "capture_s": sum(s["capture_s"] for s in lanes),
        "evictions": sum(s["evictions"] for s in lanes),
        # lanes re-laid for a larger value (lane_values.py), re-capture included
        "regrows": sum(s["regrows"] for s in lanes),
        "regrow_s": sum(s["regrow_s"] for s in lanes),
        "lanes": lanes,
    }


def _proof_line(proof: dict | None) -> str:
    if proof is None:
        return "  lockstep proof: none given (rows as the contract declares them, unproven at bind)"
    each = "; ".join(
        f"{name}: {c['ops']} ops, row 0 = batch 1" for name, c in proof["callables"].items()
    )
    inputs = f", {proof['inputs']}" if proof["inputs"] else ""
    return f"  lockstep proof: width {proof['width']} proven on {proof['device']}{inputs}: {each}"


def _batch_stats(b: Binding) -> dict | None:
    """A batched binding's width and, per batched callable, the ops it runs per row."""
    if b.batch == 1:
        return None
    return {
        "width": b.batch,
        "widths": list(b.decl.batch_widths),
        "rows": {k.name: k.batch.rows_shown() for k in b.decl.callables if k.batch is not None},
        "row_streams": len(b.rows.streams),
        "proof": b.lockstep_proof.summary() if b.lockstep_proof is not None else None,
    }


def _region_stats(region: Any) -> dict:
    t = region.tensor
    out = {
        "shape": tuple(t.shape),
        "dtype": str(t.dtype).replace("torch.", ""),
        "mib": t.numel() * t.element_size() / 2**20,
        "data_ptr": t.data_ptr(),
    }
    for counter in ("adoptions", "audit_divergences"):
        if hasattr(region, counter):
            out[counter] = getattr(region, counter)
    return out
