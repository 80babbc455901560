"""What ``bind()`` installed on a model: lanes, regions, replays, constants.

Contract of this layer. ``bind_contract`` (binder.py) fills one ``Binding`` and hands
it back, so serving code can read counters, print a report, open sessions or undo
the binding. It holds the process-scoped pieces every lane shares — the model, the
stock callables it replaced, the eager section — and the lanes themselves
(lane.py). ``regions`` and ``replays`` are lane 0's (a plain binding is one stream);
``stats()`` adds every lane's counters up. Model-agnostic.

The eager section. A lane's graphs touch only the lane's own memory, but eager code
(a miss, a callable left eager, a capture) reads scratch through the model's sites,
which all lanes share. Once sessions are served (``sessions()``), eager calls run
one at a time under ``eager_lock``, drawing from the lane's generator; with more than
one lane the sites hold a separate eager scratch set, so a lane's graphs never share
memory with anybody's eager call. A plain binding (no sessions) takes no lock here:
its callers are serialised one level up (binder.Dispatcher).
"""

from __future__ import annotations

import sys
import threading
import time
from contextlib import ExitStack, contextmanager
from typing import Any, Container, Iterator

import torch

from duplexcadence.runtime.backend import drawing_from
from duplexcadence.runtime.capture_state import RegionContents
from duplexcadence.runtime.determinism import restore_settings
from duplexcadence.runtime.eager_lock import EagerLock
from duplexcadence.runtime.regions import Region
from duplexcadence.runtime.sites import Step, format_path, get_at, require_sites, set_at
from duplexcadence.runtime.telemetry import LOGGER


class Binding:
    def __init__(
        self,
        contract: str,
        device: Any,
        *,
        determinism: dict | None = None,
        model: Any = None,
        decl: Any = None,
        audit: bool = False,
        backend: Any = None,
    ) -> None:
        self.contract = contract
        self.device = device
        self.determinism = dict(determinism or {})
        self.model = model
        self.decl = decl
        self.audit = audit
        self.backend = backend  # None: CUDA graphs where available
        self.lanes: list[Any] = []
        # session parameters (params.py): a plain binding's value, the declared capture set
        self.params_key: tuple = ()
        self.capture_keys: list[tuple] = []
        # autocast labels this deployment calls its callables under (None: every declared)
        self.served_ambient: frozenset[str] | None = None
        self.stock_callables: dict[str, Any] = {}
        self.eager: dict[str, str] = {}  # callable -> why it stays eager
        self.declared: dict[str, str] = {}  # region -> why nothing was allocated
        self.constants: dict[str, str] = {}  # host constant -> what was done
        self.folds: list[Any] = []  # folds.FoldedSite, applied first, restored last
        self.eager_lock = EagerLock()  # first come first served (eager_lock.py)
        self.plain_lock = threading.RLock()  # callers without a session, one at a time
        self.pool: Any = None  # the SessionPool, once sessions are served
        self.site_rebinds = 0
        # eager sections' waits for the eager lock (a capture holds it for its catalog):
        # how long sessions' eager steps queued behind captures and each other
        self.eager_waits = {"sections": 0, "wait_s": 0.0, "max_wait_s": 0.0}
        self._site_tensors: dict[str, Any] = {}  # region -> the tensor kept at its site
        self._eager_done: Any = None  # CUDA event: the last eager section's device work
        self._undo: list[tuple[Any, tuple[Step, ...], Any]] = []

    # lane 0 is what a plain binding is
    @property
    def regions(self) -> dict[str, Any]:
        return self.lanes[0].regions if self.lanes else {}

    @property
    def replays(self) -> dict[str, Any]:
        return self.lanes[0].engines if self.lanes else {}

    def ambient_of(self, k: Any) -> tuple:
        """Callable ``k``'s autocast states to capture: its declared ones this deployment
        serves (all of them when it names none, or none of this callable's)."""
        if self.served_ambient is None:
            return tuple(k.ambient)
        served = tuple(a for a in k.ambient if a.label in self.served_ambient)
        return served or tuple(k.ambient)

    @property
    def pooled(self) -> bool:
        return self.pool is not None

    def remember(self, obj: Any, steps: tuple[Step, ...], old: Any) -> None:
        self._undo.append((obj, steps, old))

    def install_region(self, steps: tuple[Step, ...], region: Region) -> None:
        install_region(self.model, steps, region)

    def unbind(self) -> None:
        """Put back the stock callables and constants bind() replaced, the weights it
        folded, and the determinism settings bind() changed. Regions stay: the stock
        buffers they replaced were released, so rebuild a model to go back to stock."""
        if self.pool is not None:
            self.pool.shut_down()
        while self._undo:
            obj, steps, old = self._undo.pop()
            set_at(obj, steps, old)
        while self.folds:
            self.folds.pop().restore()
        previous = self.determinism.pop("previous", None)
        if previous:
            restore_settings(previous)

    # ---------------------------------------------------------------- capture
    def capture(self, *, progress: bool = True) -> "Binding":
        """Capture every lane's catalogs (before traffic).

        bind() does this itself unless told `capture=False`, which lets serving code
        bind first (so the state rule sizes every buffer before the prompt is primed)
        and capture once the model is on its device and primed."""
        require_sites(self.model, self.decl.sites_to_check())  # the carries' sites too
        for lane in self.lanes:
            lane.capture(progress=progress)
        from duplexcadence.runtime.telemetry import capture_summary

        line = capture_summary(self.contract, self.device, self.stats()["callables"], self.eager)
        LOGGER.info(line)
        if progress:  # the progress bars went to stderr too; progress=False is quiet
            print(line, file=sys.stderr)
        return self

    @contextmanager
    def capturing(
        self, lane: Any, keep_contents: Container[str] | None = None
    ) -> Iterator["CaptureSection"]:
        """A lane captures with its own regions at the model's sites (eager warm-up
        reads scratch there), drawing from its own generator (so its graphs register
        that state), under the eager lock; the sites are put back after.

        On CUDA the device is synchronised first: a capture may not wait on an event
        recorded outside it (that invalidates the capture), so the eager sections
        inside it skip their event ordering, and this is what orders them instead.

        The section it yields can ``pause()`` between two classes: a background
        capture (lane_scheduler.py) holds the eager lock one class at a time, so the
        other lanes' eager steps wait for a class (a few hundred ms), not a value.

        The contents of the lane's regions named in ``keep_contents`` (None: all) are
        saved once here and put back at the end, for every engine captured inside
        (capture_state.py): engines inside capture with ``keep_contents=()``."""
        section = CaptureSection(self, lane, keep_contents)
        section.enter()
        try:
            yield section
        finally:
            section.exit()

    def use(self, params: dict | None = None) -> "Binding":
        """Serve a plain binding (one stream) at these session-parameter values from
        now on: the value's graphs are captured now if new (params.py)."""
        from duplexcadence.runtime.params import resolve

        if self.pool is not None:
            raise RuntimeError("a session pool binds values per session: pool.open(params=...)")
        self.lanes[0].use(resolve(self.decl.params, params))
        self.params_key = self.lanes[0].key
        return self

    # ---------------------------------------------------------- eager section
    @contextmanager
    def eager_section(self, lane: Any) -> Iterator[None]:
        """One eager call at a time, drawing from ``lane``'s generator. On CUDA the lock
        orders the host, and an event orders the device: this section's stream waits
        for the last section's work on the shared eager scratch."""
        if self.pool is None:
            yield
            return
        t0 = time.perf_counter()
        with self.eager_lock, drawing_from(self.device, lane.rng):
            waited = time.perf_counter() - t0
            w = self.eager_waits
            w["sections"] += 1
            w["wait_s"] += waited
            w["max_wait_s"] = max(w["max_wait_s"], waited)
            # inside a capture (a value's first use in a session's run) the device is
            # already ordered (capturing() synchronised) and an event is out of bounds
            cuda = self.device.type == "cuda" and not torch.cuda.is_current_stream_capturing()
            if cuda and self._eager_done is not None:
                torch.cuda.current_stream(self.device).wait_event(self._eager_done)
            yield
            self._check_sites()
            if cuda:
                done = torch.cuda.Event()
                done.record(torch.cuda.current_stream(self.device))
                self._eager_done = done

    def keep_sites(self) -> None:
        """Record what is at every allocated region's site now: from here on stock code
        that rebinds one is a contract violation, found after the eager call that did."""
        self._site_tensors = {
            r.name: get_at(self.model, r.site)
            for r in self.decl.regions.values()
            if r.site is not None and r.install == "allocate"
        }

    def _check_sites(self) -> None:
        for name, kept in self._site_tensors.items():
            now = get_at(self.model, self.decl.regions[name].site)
            if now is not kept:
                self.site_rebinds += 1
                self._site_tensors[name] = now
                msg = (
                    f"stock code rebound region {name}'s site "
                    f"{format_path(self.decl.regions[name].site)}; declared `address stable`"
                )
                LOGGER.warning("%s: every lane's classes writing it run eager from now", msg)
                for lane in self.lanes:
                    for engine in lane.engines.values():
                        if name in engine.write_through:
                            engine.drop_all(msg)

    # -------------------------------------------------------------- sessions
    def sessions(self, lanes: int = 1, **kwargs: Any) -> Any:
        """Serve many sessions on this binding: a ``SessionPool`` with ``lanes``
        concurrent replay lanes (sessions.py). Once per binding."""
        from duplexcadence.runtime.sessions import SessionPool

        SessionPool.check_args(lanes, kwargs.get("timeout_s", 60.0))
        if self.pool is not None:
            raise RuntimeError(f"binding of {self.contract} already serves a session pool")
        return SessionPool(self, lanes=lanes, **kwargs)

    # ------------------------------------------------------------- telemetry
    def stats(self) -> dict:
        from duplexcadence.runtime.telemetry import merge_lane_stats

        per_lane = [lane.engine_stats() for lane in self.lanes]
        return {
            "contract": self.contract,
            "device": str(self.device),
            "determinism": self.determinism,
            "callables": {
                name: merge_lane_stats([lane[name] for lane in per_lane])
                for name in (per_lane[0] if per_lane else {})
            },
            "lanes": len(self.lanes),
            "eager": dict(self.eager),
            "declared": dict(self.declared),
            "regions": {name: _region_stats(r) for name, r in self.regions.items()},
            "constants": dict(self.constants),
            "folds": {f.name: f.stats() for f in self.folds},
            "site_rebinds": self.site_rebinds,
            "sessions": None if self.pool is None else self.pool.stats(),
            "params": _params_stats(self),
        }

    def report(self, width: int = 120) -> str:
        """Regions, replays (hits, misses by reason, capture cost) and constants as text."""
        from duplexcadence.runtime.telemetry import eager_by_design, format_report, replay_lines

        lanes = f", {len(self.lanes)} lanes" if len(self.lanes) > 1 else ""
        lines = [f"duplexcadence binding of contract {self.contract} on {self.device}{lanes}"]
        merged = self.stats()["callables"]
        if eager_by_design(merged):
            # not a failure: say so instead of printing 0/N classes and miss counters
            lines.append(
                f"  no CUDA: eager by design: every call runs the stock code on {self.device} "
                '(bind(..., backend="simulate") runs the replay policy here and reports it)'
            )
            for name, s in merged.items():
                lines.append(f"  callable {name}: {s['calls']} calls, eager")
            lines.append(format_report(list(self.regions.values()), width=width))
        else:
            lines.append(format_report([*merged.values(), *self.regions.values()], width=width))
            lines.extend(replay_lines(merged))
        for name, why in self.eager.items():
            lines.append(f"  callable {name}: eager ({why})")
        for name, what in self.constants.items():
            lines.append(f"  constant {name}: {what}")
        lines.extend(f.report_line() for f in self.folds)
        for name, why in self.declared.items():
            lines.append(f"  region {name}: {why}")
        params = _params_stats(self)
        if params is not None:
            held = "; ".join(", ".join(s["held"]) for s in params["lanes"])
            lines.append(
                f"  session parameters: graphs of {', '.join(params['per_value'])} per value; "
                f"held {held}; {params['captures']} value capture(s) in "
                f"{params['capture_s']:.2f} s, {params['evictions']} eviction(s), "
                f"{params['regrows']} regrow(s) in {params['regrow_s']:.2f} s"
            )
        if self.pool is not None:
            lines.append(self.pool.report())
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


def infer_device(model: Any):
    """The device of the first parameter or buffer found on `model` (or its attributes)."""
    import torch

    candidates = (
        [model] + [v for v in vars(model).values()] if hasattr(model, "__dict__") else [model]
    )
    for obj in candidates:
        if isinstance(obj, torch.nn.Module):
            for t in list(obj.parameters()) + list(obj.buffers()):
                return t.device
    return torch.device("cpu")


def install_region(model: Any, steps, region: Any) -> None:
    """Put `region` at its binding site, keeping the stock state it replaces.

    The stock buffer may be larger (an implementation-constant envelope); the
    region keeps its leading part, which is all that any consumer reads.
    """
    import torch

    from duplexcadence.runtime.sites import get_at

    stock = get_at(model, steps)
    if isinstance(stock, torch.Tensor):
        leading = _leading_part(stock, tuple(region.tensor.shape))
        if leading is None:
            raise ValueError(
                f"region {region.name}: stock tensor {tuple(stock.shape)} at {format_path(steps)} "
                f"cannot hold the declared shape {tuple(region.tensor.shape)}"
            )
        with torch.no_grad():
            region.tensor.copy_(leading)
    # The stock buffer is not remembered for unbind(): holding it would keep the
    # implementation-constant envelope alive, the very memory the region saves.
    set_at(model, steps, region.tensor)


def adopt_prefix(region: Any, tensor: Any) -> Any:
    """An aliased fixed-shape region handed a stock tensor: copy its leading part in.

    Returns the region's own tensor, so the call reads the state at the region's
    address (a replay admits it) with the same values the stock tensor held.
    """
    import torch

    target = region.tensor
    if not isinstance(tensor, torch.Tensor):
        return tensor
    if tensor.data_ptr() == target.data_ptr() and tensor.shape == target.shape:
        return tensor
    leading = _leading_part(tensor, tuple(target.shape))
    if leading is None:
        return tensor  # not this region's state: leave it; admission decides
    with torch.no_grad():
        target.copy_(leading)
    return target


def _leading_part(stock: Any, shape: tuple[int, ...]) -> Any:
    """The leading `shape` block of a (possibly larger) stock tensor, or None if it
    cannot hold that shape. Only the leading part of a stock envelope is ever read."""
    if stock.dim() != len(shape) or any(s < t for s, t in zip(stock.shape, shape)):
        return None
    return stock[tuple(slice(0, n) for n in shape)]


class CaptureSection:
    """``Binding.capturing``'s hold on the model: the eager lock, the lane's generator
    as the device default, the lane's regions at the sites."""

    def __init__(
        self, binding: Binding, lane: Any, keep_contents: Container[str] | None = None
    ) -> None:
        self.binding, self.lane = binding, lane
        self.keep_contents = keep_contents
        self._contents: RegionContents | None = None
        self.pauses = 0
        self._stack: ExitStack | None = None
        self._swapped: list[tuple[Any, Any]] = []
        self._kept: dict[str, Any] = {}
        # only the outermost hold can let go: a capture inside a caller's eager
        # section (a plain binding's first use of a value) keeps the lock it came with
        self._outermost = not binding.eager_lock.held_here()

    def enter(self) -> None:
        self.binding.eager_lock.acquire()
        try:
            self._take_model()
            lane = self.lane
            self._contents = RegionContents(
                lane.regions, lane.write_through_getters(), self.keep_contents
            )
        except BaseException:
            self._give_model()
            self.binding.eager_lock.release()
            raise

    def exit(self) -> None:
        try:
            if self._contents is not None:
                self._contents.restore()
        finally:
            try:
                self._give_model()
            finally:
                self.binding.eager_lock.release()  # last: the generator and the sites are back

    def pause(self) -> None:
        """Hand the eager lock to the next waiting eager section and take it back right
        after it (eager_lock.py), the sites and the generator put back meanwhile; a no-op
        unless this is the thread's outermost hold and somebody waits."""
        lock = self.binding.eager_lock
        if not self._outermost or not lock.waiting():
            return
        self._give_model()
        try:
            lock.hand_over()
        finally:
            self._take_model()
        self.pauses += 1

    def _take_model(self) -> None:
        """The lane's generator as the device default, its regions at the sites."""
        b, lane = self.binding, self.lane
        self._stack = ExitStack()
        self._stack.enter_context(drawing_from(b.device, lane.rng))
        if b.device.type == "cuda":
            torch.cuda.synchronize(b.device)
        self._swapped = []
        self._kept = dict(b._site_tensors)
        if not lane.owns_sites:
            for r in b.decl.regions.values():
                if r.site is not None and r.install == "allocate":
                    self._swapped.append((r.site, get_at(b.model, r.site)))
                    set_at(b.model, r.site, lane.regions[r.name].tensor)
                    if r.name in b._site_tensors:  # a capture once sessions are served
                        b._site_tensors[r.name] = lane.regions[r.name].tensor

    def _give_model(self) -> None:
        b = self.binding
        for site, tensor in reversed(self._swapped):
            set_at(b.model, site, tensor)
        b._site_tensors = self._kept
        self._swapped = []
        stack, self._stack = self._stack, None
        if stack is not None:
            stack.close()
