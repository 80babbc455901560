"""Verification against the model: a bound copy streamed beside a stock copy.

Contract of this layer. ``verify_stream(bind, spec, chunks)`` builds two copies of the
user's model with the ``StreamSpec`` (streams.py), binds one with a contract's
generated ``bind`` and leaves the other stock, then drives both with the same seeded
traffic, one chunk each in turn. After every chunk it compares, bit for bit
(audit.py: shape, dtype and every element's bit pattern):

  * every output the chunk yielded, leaf by leaf (``output[1]["pcm"]``);
  * every declared region that holds state across calls (lifetime turn, session,
    process) and has a site: the value at that site on the bound copy (the carry's
    view after its writeback) against the value at the same site on the stock copy
    (what the model's own trim kept after the same chunk). This is the audit that
    catches a wrong retention: ``bind(audit=True)`` checks the writeback against the
    contract's own policy, which a wrong policy passes; here the reference is the
    model. A stock buffer larger than the demand-sized region is compared on its
    leading part, the only part any consumer reads (binding.install_region).

The first divergence is reported by name (the output path or the region and its
site), chunk index, both shapes, the first differing element with both values, and
the box of indices holding every differing element; then verification **stops**:
past a divergence the two copies no longer see the same state, so later
comparisons would only repeat it. An exception raised by the bound copy is a
divergence too (a contract whose shapes do not fit the model fails there).

Both copies draw from their own random-number streams: the global generators are
swapped per copy around each chunk, so a model that draws randomness sees the same
numbers in both copies. On a CPU the bound copy runs the simulated backend by
default (``backend="simulate"``: the real admission and signature policy), so the
verdict also says how many calls replayed; on CUDA, real graphs.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import torch

from ..audit import bitwise_equal, difference_box, first_difference, named_leaves
from ..state.regions import leading_part
from ..engine.signature import STALE_HOST_VALUE
from ..state.sites import SiteError, format_path, get_at
from .paired_streams import Divergence, RngStreams, next_pair
from .streams import StreamSpec

# Regions whose value after a chunk is read by a later call: the state to compare.
# Scratch (operator, unit, chunk) is dead once its call returns.
STATE_LIFETIMES = frozenset({"turn", "session", "process"})


class BindRefused(Exception):
    """bind() refused the bound copy (a site missing, a shape contradicted): the
    contract does not fit this model; the CLI shows it at the declaration (CLK090)."""


@dataclass
class Verdict:
    contract: str
    device: str
    backend: str
    chunks: int  # requested
    compared: int = 0  # chunks compared before stopping
    outputs: int = 0  # output leaves compared
    regions: list[str] = field(default_factory=list)  # regions compared after each chunk
    skipped_regions: dict[str, str] = field(default_factory=dict)  # region -> why not
    divergence: Divergence | None = None
    replay: dict[str, dict] = field(default_factory=dict)  # callable -> calls, hits, misses
    report: str = ""  # the bound copy's binding.report()
    reference: dict | None = None  # two stock copies compared first (reproduce.py), if asked
    allow_eager: bool = False  # a callable declared `replay` that never replayed is accepted

    @property
    def never_replayed(self) -> dict[str, str]:
        """Callables the contract declares `replay` that were called and never replayed:
        exact, but the contract does not do what it says (a wrong hop, an unkeyable
        argument); each with the reason most of its calls missed for, and the first
        such miss explained."""
        out = {}
        for name, r in self.replay.items():
            if r.get("declared_eager") or not r["calls"] or r["hits"]:
                continue
            reason = max(r["misses"], key=r["misses"].get) if r["misses"] else "?"
            detail = (r.get("miss_details") or {}).get(reason, "")
            out[name] = f"{reason}" + (f": {detail}" if detail else "")
        return out

    @property
    def stale_host_values(self) -> dict[str, str]:
        """Callables a simulated replay found reading a host value other than the
        capture's (host_program.py): this copy's bytes are right only because simulate
        re-ran the body; a real graph would have returned the capture's. Never accepted."""
        return {
            name: (r.get("miss_details") or {}).get(STALE_HOST_VALUE, "")
            for name, r in self.replay.items()
            if (r.get("misses") or {}).get(STALE_HOST_VALUE)
        }

    @property
    def ok(self) -> bool:
        exact = self.divergence is None and self.compared == self.chunks
        graphs_hold = not self.stale_host_values
        return exact and graphs_hold and (self.allow_eager or not self.never_replayed)

    def describe(self) -> str:
        if self.divergence is not None:
            lines = [self.divergence.describe()]
        else:
            what = ", ".join(self.regions) or "none"
            head = "verified" if self.ok else "NOT verified:"
            lines = [
                f"{head} {self.compared}/{self.chunks} chunks of {self.contract} on "
                f"{self.device}: every output and every state region ({what}) bit-identical "
                "to the stock copy"
            ]
        if self.reference is not None and self.reference.get("reproducible"):
            lines.append(
                f"  reference: two stock copies reproduce each other over {self.chunks} chunks"
            )
        for name, why in self.stale_host_values.items():
            lines.append(
                f"  not verified: callable {name}: a graph would replay a stale host value "
                f"(its bytes here are the re-run body's): {why}"
            )
        for name, why in self.never_replayed.items():
            verdict = "accepted (--allow-eager)" if self.allow_eager else "not verified"
            lines.append(
                f"  {verdict}: callable {name} is declared `replay` but none of its calls "
                f"replayed; missed for {why}"
            )
        for name, why in self.skipped_regions.items():
            lines.append(f"  region {name} not compared: {why}")
        for name, r in self.replay.items():
            misses = ", ".join(f"{k}={v}" for k, v in sorted(r["misses"].items()))
            lines.append(
                f"  callable {name}: {r['hits']}/{r['calls']} calls replayed ({self.backend})"
                + (f"; eager: {misses}" if misses else "")
            )
        return "\n".join(lines)

    def to_json(self) -> dict:
        out = asdict(self)
        out["ok"] = self.ok
        if self.divergence is not None:
            out["divergence"] = dict(out["divergence"], describe=self.divergence.describe())
        return out


def verify_stream(
    bind: Callable[..., Any],
    spec: StreamSpec,
    chunks: int,
    *,
    device: str | torch.device | None = None,
    backend: str | None = None,
    reference_check: bool = False,
    allow_eager: bool = False,
) -> Verdict:
    """Stream ``chunks`` chunks through a stock copy and a copy bound with ``bind``
    (a generated adapter's ``bind``) and compare them (see module docstring). With
    ``reference_check`` two stock copies are compared first (reproduce.py); if they
    differ, the bound copy is not compared: no verdict holds against a reference that
    moves. A callable declared `replay` none of whose calls replayed fails the verdict
    unless ``allow_eager``."""
    if chunks < 1:
        raise ValueError(f"chunks must be at least 1, got {chunks}")
    device = torch.device(device if device is not None else spec.device)
    if backend is None:
        backend = "cuda" if device.type == "cuda" else "simulate"
    reference = None
    if reference_check:
        from .reproduce import reproduce_stream

        reference = reproduce_stream(spec, chunks, trace=False, device=device)
        if not reference.reproducible:
            verdict = Verdict("?", str(device), backend, chunks, reference=reference.to_json())
            d = reference.output_divergence or {"chunk": reference.compared, "output": "state"}
            verdict.divergence = Divergence(
                d["chunk"],
                "reference",
                d["output"],
                note="two STOCK copies already differ here: the reference does not reproduce "
                "itself, so no bound copy can be checked against it (`clockc reproduce "
                "--stream ...` finds the operation)",
            )
            return verdict
    stock, bound = spec.build(), spec.build()
    try:
        binding = bind(bound, device=device, backend=backend, progress=False)
    except (LookupError, ValueError, TypeError, RuntimeError) as exc:
        raise BindRefused(str(exc)) from exc
    verdict = Verdict(binding.contract, str(device), backend, chunks, allow_eager=allow_eager)
    if reference is not None:
        verdict.reference = reference.to_json()
    state_regions = []
    for r in binding.decl.regions.values():
        if r.site is None:
            verdict.skipped_regions[r.name] = "no site on the model"
        elif r.spec.lifetime not in STATE_LIFETIMES:
            verdict.skipped_regions[r.name] = f"scratch (lifetime {r.spec.lifetime})"
        else:
            state_regions.append(r)
    verdict.regions = [r.name for r in state_regions]
    rng = RngStreams(device)
    stock_stream = rng.wrap("stock", spec.drive(stock, chunks))
    bound_stream = rng.wrap("bound", spec.drive(bound, chunks))
    try:
        for chunk in range(chunks):
            found = next_pair(stock_stream, bound_stream, chunk)
            if isinstance(found, Divergence):
                verdict.divergence = found
                break
            expected, actual = found
            verdict.divergence = _compare_outputs(expected, actual, chunk, verdict)
            if verdict.divergence is None:
                verdict.divergence = _compare_regions(stock, bound, state_regions, chunk)
            if verdict.divergence is not None:
                break
            verdict.compared = chunk + 1
    finally:
        stock_stream.close()
        bound_stream.close()
        rng.restore()
    for name, s in binding.stats()["callables"].items():
        verdict.replay[name] = {
            "calls": s["calls"],
            "hits": s["hits"],
            "misses": s["misses"],
            "miss_details": s.get("miss_details", {}),
            "declared_eager": name in binding.eager,
        }
    verdict.report = binding.report()
    return verdict


# ----------------------------------------------------------------- comparing
def _compare_outputs(expected: Any, actual: Any, chunk: int, verdict: Verdict) -> Any:
    stock_leaves, bound_leaves = named_leaves(expected, "output"), named_leaves(actual, "output")
    if list(stock_leaves) != list(bound_leaves):
        missing = [p for p in stock_leaves if p not in bound_leaves]
        extra = [p for p in bound_leaves if p not in stock_leaves]
        return Divergence(
            chunk,
            "output",
            (missing or extra)[0],
            note=f"output structure differs (stock only: {missing}, bound only: {extra})",
        )
    for path, a in stock_leaves.items():
        verdict.outputs += 1
        found = _compare(a, bound_leaves[path], chunk, "output", path)
        if found is not None:
            return found
    return None


def _compare_regions(stock: Any, bound: Any, regions: list, chunk: int) -> Divergence | None:
    for r in regions:
        site = format_path(r.site)
        a, b = _at(stock, r.site), _at(bound, r.site)
        if a is _ABSENT and b is _ABSENT:
            continue  # neither copy has the state yet (created by a later chunk)
        if a is _ABSENT or b is _ABSENT:
            where = "stock" if a is _ABSENT else "bound"
            return Divergence(
                chunk, "region", r.name, site, note=f"site missing on the {where} copy"
            )
        if r.install == "allocate" and isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
            a = leading_part(a, tuple(b.shape)) if a.shape != b.shape else a
            if a is None:
                a = _at(stock, r.site)  # cannot hold the region: compare as is (shape differs)
        found = _compare(a, b, chunk, "region", r.name, site)
        if found is not None:
            return found
    return None


_ABSENT = object()  # a site that a copy does not have (yet)


def _at(model: Any, site: tuple) -> Any:
    try:
        return get_at(model, site)
    except (SiteError, LookupError, AttributeError):
        return _ABSENT


def _compare(a: Any, b: Any, chunk: int, kind: str, name: str, site: str | None = None) -> Any:
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
        if type(a) is type(b) and not isinstance(a, torch.Tensor) and _plain_equal(a, b):
            return None
        return Divergence(
            chunk,
            kind,
            name,
            site,
            stock_value=_show(a),
            bound_value=_show(b),
            note="values differ",
        )
    if bitwise_equal(a, b):
        return None
    shapes = dict(stock_shape=tuple(a.shape), bound_shape=tuple(b.shape))
    if a.dtype != b.dtype:
        return Divergence(chunk, kind, name, site, **shapes, note=f"dtype {a.dtype} vs {b.dtype}")
    a, b = a.detach().cpu(), b.detach().cpu()
    index = first_difference(a, b)
    values = {}
    if index is not None and len(index) == a.dim():
        values = dict(stock_value=_value(a, index), bound_value=_value(b, index))
    common = tuple(slice(0, min(x, y)) for x, y in zip(a.shape, b.shape))
    # the box of differences within the extent both copies hold (all of it when the
    # shapes agree); a longer copy's extra elements are named by the shapes
    count, box = difference_box(a[common], b[common]) if a.dim() == b.dim() else (None, ())
    return Divergence(
        chunk, kind, name, site, **shapes, index=index, box=box, count=count, **values
    )


def _value(t: torch.Tensor, index: tuple[int, ...]) -> Any:
    if any(i >= n for i, n in zip(index, t.shape)):
        return None  # past this tensor's extent (the other one is longer)
    return t[index].item()


def _plain_equal(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - an object without a usable ==: not comparable
        return a is b


def _show(x: Any) -> str:
    if isinstance(x, torch.Tensor):
        return f"tensor{list(x.shape)} {str(x.dtype).removeprefix('torch.')}"
    text = repr(x)
    return text if len(text) <= 80 else text[:77] + "..."
