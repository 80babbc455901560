"""Capacity plan: how many sessions one GPU holds and serves, from a contract.

Contract of this layer. From the validated contract and its analysis alone,
``footprint`` splits the memory a served contract needs by who owns it, following the
region lifetimes (runtime/serving/declared.py, runtime/serving/sessions.py):
  * per session — every region of lifetime ``turn`` or ``session``: a session keeps
    its own copy of these between steps (declared-only regions too: they describe
    stock state the session owns, e.g. a vendor ring);
  * per lane — a lane's copy of every region bind allocates, plus the replay reserve
    of its catalogs (eq. 6: staging of tensor arguments, summed over classes);
  * eager scratch — with more than one lane the model's sites hold one more set of the
    regions installed there, for eager calls;
  * per voice — a kept turn start is a copy of the per-session state (upper bound).
``predict`` adds a measured profile (bench/ writes it: the process's bytes with no
session open, per lane count, and the chunks per second K saturated lanes serve) and
returns the sessions one GPU holds by memory and by time at the cadence. What the
contract cannot know — weights, graph pools, kernel time — comes only from the
profile; without one, only the footprint is printed.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from duplexcadence.compiler.analysis import Analysis
from duplexcadence.compiler.lower import region_installs
from duplexcadence.compiler.validate import Checked

PER_SESSION = frozenset({"turn", "session"})


@dataclass(frozen=True)
class RegionShare:
    name: str
    lifetime: str
    install: str
    nbytes: int
    owner: str  # session | lane | process | documented
    slot: int | None = None  # lockstep: the axis sessions stack on (batch_rules.py)


@dataclass(frozen=True)
class Footprint:
    contract: str
    per_session_bytes: int
    per_lane_bytes: int
    eager_scratch_bytes: int
    per_voice_bytes: int
    regions: tuple[RegionShare, ...] = field(default_factory=tuple)
    # lockstep: the batch widths a binding may serve; a batched binding of width W holds
    # W sessions' per-session regions side by side in its slots (W x per_session_bytes)
    batch_widths: tuple[int, ...] = ()

    def static_bytes(self, lanes: int, sessions: int, voices: int) -> int:
        """Contract-owned bytes only (no weights, pools or kernels' workspaces)."""
        scratch = self.eager_scratch_bytes if lanes > 1 else 0
        return (
            lanes * self.per_lane_bytes
            + scratch
            + sessions * self.per_session_bytes
            + voices * self.per_voice_bytes
        )


def footprint(checked: Checked, analysis: Analysis) -> Footprint:
    c = checked.contract
    installs = region_installs(c)
    demand = {r.name: r.demand_bytes for r in analysis.regions}
    shares = []
    for r in c.regions:
        install = installs[r.name]
        if r.lifetime in PER_SESSION:
            owner = "session"
        elif install == "declared":
            owner = "documented"
        elif r.lifetime == "process":
            owner = "process"
        else:
            owner = "lane"
        shares.append(RegionShare(r.name, r.lifetime, install, demand[r.name], owner, r.slot))
    per_session = sum(s.nbytes for s in shares if s.owner == "session")
    lane_regions = sum(s.nbytes for s in shares if s.install != "declared")
    staging = sum(k.staging_bytes for k in analysis.callables)
    site_regions = {r.name for r in c.regions if r.site is not None}
    eager = sum(s.nbytes for s in shares if s.install == "allocate" and s.name in site_regions)
    return Footprint(
        contract=c.name,
        per_session_bytes=per_session,
        per_lane_bytes=lane_regions + staging,
        eager_scratch_bytes=eager,
        per_voice_bytes=per_session,
        regions=tuple(shares),
        batch_widths=analysis.batch_widths,
    )


@dataclass(frozen=True)
class Profile:
    """What bench/ measured for one contract on one GPU (``sessions_*.json`` writes
    it under ``profile``)."""

    gpu_bytes: int  # device memory the process may use
    base_bytes: dict[int, int]  # lanes -> process bytes, pool built, no session open
    chunks_per_s: dict[int, float]  # lanes -> chunks/s served with every lane busy
    cadence_s: float = 1.0  # one chunk per session per cadence while it speaks
    utilization: float = 0.9  # share of the saturated rate kept for zero misses
    speech_share: float = 1.0  # chunks a session sends per cadence on average (turns, silences)
    source: str = ""  # where the numbers come from
    # session parameters (a voice per user): what one more value's graphs take on a lane
    # and how long the pool's capture thread takes to capture them (None: not measured)
    graph_bytes_per_value: int | None = None
    capture_s_per_value: float | None = None

    @classmethod
    def from_json(cls, doc: dict) -> "Profile":
        return cls(
            gpu_bytes=int(doc["gpu_bytes"]),
            base_bytes={int(k): int(v) for k, v in doc["base_bytes"].items()},
            chunks_per_s={int(k): float(v) for k, v in doc["chunks_per_s"].items()},
            cadence_s=float(doc.get("cadence_s", 1.0)),
            utilization=float(doc.get("utilization", 0.9)),
            speech_share=float(doc.get("speech_share", 1.0)),
            source=str(doc.get("source", "")),
            graph_bytes_per_value=_opt(doc.get("graph_bytes_per_value"), int),
            capture_s_per_value=_opt(doc.get("capture_s_per_value"), float),
        )


def _opt(value: object, kind: type) -> object:
    return None if value is None else kind(value)


def predict(
    fp: Footprint,
    profile: Profile,
    lanes: int,
    voices: int = 1,
    values: int = 1,
    arrivals_s: float | None = None,
) -> dict:
    """Sessions one GPU holds by memory and serves by time with ``lanes`` lanes; with
    ``values`` distinct session-parameter values (a voice prompt length per user), each
    held by at least one lane: their graphs' bytes, the values each lane must hold to keep
    them all (its ``hold``), and the capture thread's seconds to capture them all.

    ``arrivals_s``: the values' first sessions arrive over this many seconds. A capture
    holds the process's one eager lock (runtime/serving/eager_lock.py), which the steps of values
    not captured yet need too, so ``capture_lock_share`` (capture seconds per second of
    arrivals) is a floor on that lock's load: at 1 or more sessions queue behind captures
    whatever the GPU could do (measured on the H200: 16 values in 50 s, 0.8 of the lock in
    one process, 545 of 590 chunks late; four processes, 0.2 each, 105)."""
    if lanes not in profile.base_bytes or lanes not in profile.chunks_per_s:
        known = sorted(set(profile.base_bytes) & set(profile.chunks_per_s))
        raise KeyError(f"the profile has no measurement for {lanes} lanes (has {known})")
    graphs = (
        None if profile.graph_bytes_per_value is None else values * profile.graph_bytes_per_value
    )
    free = profile.gpu_bytes - profile.base_bytes[lanes] - voices * fp.per_voice_bytes
    free -= graphs or 0
    by_memory = max(0, free // fp.per_session_bytes) if fp.per_session_bytes else math.inf
    rate = profile.chunks_per_s[lanes] * profile.utilization
    by_time = math.floor(rate * profile.cadence_s / profile.speech_share)
    sessions = min(by_memory, by_time)
    capture_s = (
        None if profile.capture_s_per_value is None else values * profile.capture_s_per_value
    )
    return {
        "lanes": lanes,
        "voices": voices,
        "sessions_by_memory": by_memory,
        "sessions_by_time": by_time,
        "sessions": sessions,
        "limited_by": "memory" if by_memory < by_time else "time",
        "values": values,
        "hold_to_keep_every_value": math.ceil(values / lanes),
        "graph_bytes_for_values": graphs,
        "capture_s_for_values": capture_s,
        "arrivals_s": arrivals_s,
        "capture_lock_share": (
            None if capture_s is None or not arrivals_s else round(capture_s / arrivals_s, 3)
        ),
        "peak_bytes_at_sessions": (
            None
            if sessions == math.inf
            else profile.base_bytes[lanes]
            + voices * fp.per_voice_bytes
            + int(sessions) * fp.per_session_bytes
            + (graphs or 0)
        ),
    }


def footprint_json(fp: Footprint) -> dict:
    doc = asdict(fp)
    if not fp.batch_widths:  # lockstep fields only where a callable is batched
        del doc["batch_widths"]
        for share in doc["regions"]:
            del share["slot"]
    return doc


def plan_text(fp: Footprint, predictions: list[dict]) -> str:
    gib = 2**30
    lines = [
        f"{fp.contract}: capacity plan",
        f"  per session  {fp.per_session_bytes / gib:8.3f} GiB  (regions of lifetime turn or session)",
        f"  per lane     {fp.per_lane_bytes / gib:8.3f} GiB  (a copy of every allocated region + staging)",
        f"  eager scratch{fp.eager_scratch_bytes / gib:8.3f} GiB  (with more than one lane)",
        f"  per voice    {fp.per_voice_bytes / gib:8.3f} GiB  (a kept turn start, upper bound)",
    ]
    for s in fp.regions:
        lines.append(f"    {s.name:<24} {s.lifetime:<9} {s.owner:<10} {s.nbytes / 2**20:10.2f} MiB")
    for width in fp.batch_widths:  # the per-session regions of a batched binding
        slotted = sum(s.nbytes for s in fp.regions if s.slot is not None)
        lines.append(
            f"  at batch width {width:<4} {width * slotted / gib:8.3f} GiB  "
            f"(slotted regions: {width} sessions in lockstep, one slot each)"
        )
    for p in predictions:
        lines.append(
            f"  {p['lanes']} lane(s), {p['voices']} voice(s): {p['sessions']} sessions "
            f"(memory {p['sessions_by_memory']}, time {p['sessions_by_time']}; limited by "
            f"{p['limited_by']})"
        )
        if p.get("values", 1) > 1:
            graphs = p["graph_bytes_for_values"]
            secs = p["capture_s_for_values"]
            lines.append(
                f"    {p['values']} parameter values: each lane holds {p['hold_to_keep_every_value']} "
                f"to keep them all; graphs "
                + ("not in the profile" if graphs is None else f"{graphs / gib:.2f} GiB")
                + ", captured between steps in "
                + ("(not in the profile)" if secs is None else f"{secs:.0f} s")
            )
            share = p.get("capture_lock_share")
            if share is not None:
                lines.append(
                    f"    arriving over {p['arrivals_s']:g} s: captures hold {share:.0%} of one "
                    "process's eager lock"
                    + (
                        "; at 100 % or more sessions queue behind captures (serve them from "
                        "more processes)"
                        if share >= 1
                        else ""
                    )
                )
    return "\n".join(lines)
