"""Session parameters at run time: one contract, many bound values, graphs per value.

Contract of this layer. A contract may declare values each session binds (`param`,
e.g. the voice prompt's length); clockc checked that every value in the domain has
the same catalog, each region's attended extents shifted by `Σ coeff · (value −
default)` (``RegionDecl.shift``), and retention sizes likewise
(``RegionDecl.retention_shift``), and region shapes per dim likewise
(``RegionDecl.shape_shift``; ``spec.shape`` is the domain's largest). Here:

  * ``resolve`` turns what a caller passes (``{"f_prompt": 200}``, or nothing) into a
    ``ParamKey`` — every parameter, defaults filled — or raises ``ParamError`` for an
    unknown name or a value outside its domain (an error at bind or open, never a
    silent eager fallback);
  * ``shape_at`` gives a region's shape at a value (what a session's copy of it is
    allocated at) and ``widest`` the per-dim largest over values (a lane's regions:
    every value it serves reads views of them, lane.py);
  * ``classes_at``/``retention_at`` give one value's catalog and retention from the
    declared (default) ones, and ``depends`` says which callables' graphs change with
    the value at all (a vocoder that reads no shifted region keeps one set);
  * ``ValueGraphs`` is a lane's bounded store of per-value engines, least recently
    used evicted past ``hold``, with the capture time and evictions counted.
Capture itself stays in lane.py (the lane knows its pool, stream and regions).
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Mapping

from ..engine.classes import CaptureClass, RegionView
from ..state.regions import RegionSpec

ParamKey = tuple[tuple[str, int], ...]  # (name, value) for every parameter, sorted


class ParamError(ValueError):
    """A parameter value a contract does not declare (unknown name, outside its domain)."""


@dataclass(frozen=True)
class ParamDecl:
    name: str
    lo: int
    hi: int
    default: int
    capture: tuple[int, ...] = ()
    hold: int | None = None  # values whose graphs a lane keeps; None: every value used


def resolve(params: tuple[ParamDecl, ...], given: Mapping[str, Any] | None) -> ParamKey:
    given = dict(given or {})
    known = {p.name: p for p in params}
    unknown = sorted(set(given) - set(known))
    if unknown:
        declared = ", ".join(sorted(known)) or "none"
        raise ParamError(f"unknown session parameter(s) {unknown} (declared: {declared})")
    out = []
    for p in sorted(params, key=lambda p: p.name):
        v = given.get(p.name, p.default)
        if isinstance(v, bool) or not isinstance(v, int):
            raise ParamError(f"session parameter {p.name} must be an int, got {v!r}")
        if not p.lo <= v <= p.hi:
            raise ParamError(
                f"session parameter {p.name}={v} is outside its declared domain "
                f"{p.lo}..{p.hi}: the contract has no catalog for it"
            )
        out.append((p.name, v))
    return tuple(out)


def default_key(params: tuple[ParamDecl, ...]) -> ParamKey:
    return resolve(params, None)


def _delta(terms: tuple[tuple[str, int], ...], key: ParamKey, params) -> int:
    values, defaults = dict(key), {p.name: p.default for p in params}
    return sum(c * (values[name] - defaults[name]) for name, c in terms)


def shifts(decl: Any, key: ParamKey) -> dict[str, int]:
    """Region -> how far its attended extents move at ``key``."""
    return {name: _delta(r.shift, key, decl.params) for name, r in decl.regions.items() if r.shift}


def depends(decl: Any, k: Any) -> bool:
    """Whether callable ``k``'s graphs differ between values: it reads a region whose
    extents move, or writes back a carry whose retention does."""
    moving = {n for n, r in decl.regions.items() if r.shift}
    retaining = {n for n, r in decl.regions.items() if r.retention_shift}
    if any(r.region in retaining for r in k.retains):
        return True
    return any(_reads(cls, moving) for cls in k.classes)


def _reads(cls: CaptureClass, regions: set[str]) -> bool:
    found = []

    def walk(x: Any) -> None:
        if isinstance(x, RegionView) and x.region in regions:
            found.append(x)
        elif isinstance(x, (tuple, list)):
            for i in x:
                walk(i)
        elif isinstance(x, dict):
            for i in x.values():
                walk(i)

    walk((cls.args, dict(cls.kwargs)))
    return bool(found)


def classes_at(decl: Any, k: Any, key: ParamKey) -> list[CaptureClass]:
    """Callable ``k``'s catalog at ``key``: the declared classes with every shifted
    region's extent moved, relabelled (a label lists `region=extent` pairs)."""
    moved = shifts(decl, key)
    if not any(moved.values()):
        return list(k.classes)

    def move(x: Any) -> Any:
        if isinstance(x, RegionView) and x.extent is not None and x.region in moved:
            return dataclasses.replace(x, extent=x.extent + moved[x.region])
        if type(x) in (tuple, list):
            return type(x)(move(i) for i in x)
        if type(x) is dict:
            return {n: move(v) for n, v in x.items()}
        return x

    def label(name: str) -> str:
        parts = []
        for part in name.split(","):
            region, eq, value = part.partition("=")
            if eq and region in moved and value.lstrip("-").isdigit():
                part = f"{region}={int(value) + moved[region]}"
            parts.append(part)
        return ",".join(parts)

    return [
        CaptureClass(
            name=label(c.name),
            args=move(c.args),
            kwargs={n: move(v) for n, v in c.kwargs.items()},
        )
        for c in k.classes
    ]


def retention_at(decl: Any, region: Any, key: ParamKey) -> Any:
    """A region's retention policy at ``key`` (its fields shifted in declared order)."""
    if region.retention is None or not region.retention_shift:
        return region.retention
    fields = [f.name for f in dataclasses.fields(region.retention)]
    update = {
        f: getattr(region.retention, f) + _delta(terms, key, decl.params)
        for f, terms in zip(fields, region.retention_shift)
        if terms
    }
    return dataclasses.replace(region.retention, **update)


def shape_at(decl: Any, region: Any, key: ParamKey) -> tuple[int, ...]:
    """``region``'s shape at ``key``. ``spec.shape`` is the domain's largest, each dim
    the reference plus the larger growth at either end of each parameter (clockc,
    compiler/params.py), so the reference shape is that less the growth."""
    top = region.spec.shape
    if not region.shape_shift:
        return top
    by_name = {p.name: p for p in decl.params}
    out = []
    for d, terms in zip(top, region.shape_shift):
        growth = sum(
            max(c * (by_name[n].lo - by_name[n].default), c * (by_name[n].hi - by_name[n].default))
            for n, c in terms
        )
        out.append(d - growth + _delta(terms, key, decl.params))
    return tuple(out)


def spec_at(decl: Any, region: Any, key: ParamKey) -> RegionSpec:
    return dataclasses.replace(region.spec, shape=shape_at(decl, region, key))


def widest(*shapes: tuple[int, ...]) -> tuple[int, ...]:
    """Per dim, the largest of ``shapes`` (one region's, at several values)."""
    return tuple(max(d) for d in zip(*shapes))


def label(key: ParamKey) -> str:
    return ",".join(f"{n}={v}" for n, v in key) or "-"


def merge_values(per_value: list[tuple[str, dict]]) -> dict:
    """One callable's ``stats()`` over the values a lane captured it at (held and
    evicted): counters added up as over lanes, every value's classes listed."""
    from ..telemetry import merge_lane_stats

    out = dict(merge_lane_stats([s for _, s in per_value]))
    out.pop("lanes", None)
    out["classes"] = [dict(c, params=v) for v, s in per_value for c in s["classes"]]
    out["values"] = len(per_value)
    return out


class ValueGraphs:
    """One lane's engines per parameter value, least recently used first."""

    def __init__(self, hold: int | None, budget_bytes: int | None = None) -> None:
        self.hold = hold
        # a session pool's graph memory per lane (``graph_budget_mib``): least recently
        # used values evicted past it too, by their graphs' measured bytes
        self.budget_bytes = budget_bytes
        self.values: OrderedDict[ParamKey, dict[str, Any]] = OrderedDict()
        self.evictions = 0
        self.captures = 0  # values captured on this lane
        self.capture_s = 0.0
        self.regrows = 0  # the lane's regions grew for a larger value (lane_values.py)
        self.regrow_s = 0.0  # re-allocation and re-capture, the value's capture included
        self.retired: list[tuple[str, dict[str, dict]]] = []  # evicted values' stats

    def get(self, key: ParamKey) -> dict[str, Any] | None:
        engines = self.values.get(key)
        if engines is not None:
            self.values.move_to_end(key)
        return engines

    def put(self, key: ParamKey, engines: dict[str, Any]) -> list[ParamKey]:
        """Keep ``engines`` for ``key``; returns the values evicted to stay in ``hold``."""
        self.values[key] = engines
        self.values.move_to_end(key)
        evicted = []
        while len(self.values) > 1 and (
            (self.hold is not None and len(self.values) > self.hold) or self._over_budget()
        ):
            old, dropped = self.values.popitem(last=False)
            for engine in dropped.values():
                engine.release()
            self.retired.append((label(old), {n: e.stats() for n, e in dropped.items()}))
            self.evictions += 1
            evicted.append(old)
        return evicted

    def graph_bytes(self) -> int:
        """The measured bytes of every held value's graphs (0 where not measured)."""
        return sum(
            e.stats().get("capture_allocated_bytes") or 0
            for engines in self.values.values()
            for e in engines.values()
        )

    def _over_budget(self) -> bool:
        return self.budget_bytes is not None and self.graph_bytes() > self.budget_bytes

    def retire_all(self) -> None:
        """Release every value's engines, keeping their stats (the lane grew)."""
        for key, engines in self.values.items():
            for engine in engines.values():
                engine.release()
            self.retired.append((label(key), {n: e.stats() for n, e in engines.items()}))
        self.values.clear()

    def engine_stats(self) -> dict[str, list[tuple[str, dict]]]:
        """Callable -> (value, stats) of every value captured here, evicted ones too."""
        out: dict[str, list[tuple[str, dict]]] = {}
        for v, per in self.retired:
            for name, s in per.items():
                out.setdefault(name, []).append((v, s))
        for key, engines in self.values.items():
            for name, e in engines.items():
                out.setdefault(name, []).append((label(key), e.stats()))
        return out

    def stats(self) -> dict:
        return {
            "held": [label(k) for k in self.values],
            "hold": self.hold,
            "budget_bytes": self.budget_bytes,
            "captures": self.captures,
            "capture_s": self.capture_s,
            "evictions": self.evictions,
            "regrows": self.regrows,
            "regrow_s": self.regrow_s,
        }
