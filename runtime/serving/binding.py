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
from contextlib import contextmanager
from typing import Any, Container, Iterator

import torch

from duplexcadence.runtime.engine.backend import drawing_from
from duplexcadence.runtime.engine.determinism import restore_settings
from duplexcadence.runtime.engine.per_row import RowSetup
from duplexcadence.runtime.serving.binding_report import binding_report, binding_stats
from duplexcadence.runtime.serving.capture_section import CaptureSection
from duplexcadence.runtime.serving.eager_lock import EagerLock
from duplexcadence.runtime.state.regions import Region, leading_part
from duplexcadence.runtime.state.sites import Step, format_path, get_at, require_sites, set_at
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
        self.lockstep_pool: Any = None  # a batched binding's LockstepPool (lockstep.py)
        # sessions stacked in each batched call (bind(batch=W)) and what its per-row ops
        # need from the model (weights, side streams, module paths), found once at bind
        self.batch = 1
        self.rows = RowSetup()
        self.lockstep_proof: Any = None  # the admitted proof (lockstep_proof.py)
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
        for pool in (self.pool, self.lockstep_pool):
            if pool is not None:
                pool.shut_down()
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
    ) -> Iterator[CaptureSection]:
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
        from duplexcadence.runtime.serving.params import resolve

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
        from duplexcadence.runtime.serving.sessions import SessionPool

        SessionPool.check_args(lanes, kwargs.get("timeout_s", 60.0))
        if self.batch > 1:
            # a pool swaps one session's state into a lane per step; a batched binding's
            # slots hold W sessions at once, which that swap would not keep apart
            raise RuntimeError(
                f"binding of {self.contract} is batched ({self.batch} sessions per call): "
                "it serves its slots' sessions in lockstep (binding.lockstep(step, ...)), "
                "not a session pool; bind without batch= for a pool"
            )
        if self.pool is not None:
            raise RuntimeError(f"binding of {self.contract} already serves a session pool")
        return SessionPool(self, lanes=lanes, **kwargs)

    def lockstep(self, step: Any, **kwargs: Any) -> Any:
        """Serve this batched binding's ``batch`` slots as sessions in lockstep: a
        ``LockstepPool`` (lockstep.py) whose ticks call ``step`` on the slots' rows
        stacked (``reset``, ``hold``, ``gather_s``, ``timeout_s`` as there)."""
        from duplexcadence.runtime.serving.lockstep import LockstepPool

        if self.lockstep_pool is not None:
            raise RuntimeError(f"binding of {self.contract} already serves a lockstep pool")
        self.lockstep_pool = LockstepPool(self.batch, step, **kwargs)
        return self.lockstep_pool

    # ------------------------------------------------------------- telemetry
    def controls(self, name: str, result: Any) -> dict[str, int]:
        """The control outputs callable ``name`` declares, read from ``result`` (what one of
        its calls returned) as host ints: ``{"accepted": 3}``; ``ControlError`` names the
        control that is missing, of another dtype or shape, or out of its declared range.
        Reads the device (a synchronisation): call it where the host needs the value."""
        from ..state.control_outputs import read_controls

        k = next((c for c in self.decl.callables if c.name == name), None)
        if k is None:
            known = ", ".join(c.name for c in self.decl.callables)
            raise KeyError(f"no callable {name!r} in contract {self.decl.name!r} ({known})")
        return read_controls(name, k.controls, result)

    def stats(self) -> dict:
        """Counters of every lane's engines merged, regions, constants, sessions and
        parameter values (binding_report.py)."""
        return binding_stats(self)

    def report(self, width: int = 120) -> str:
        """Regions, replays (hits, misses by reason, capture cost) and constants as text."""
        return binding_report(self, width)


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

    from duplexcadence.runtime.state.sites import get_at

    stock = get_at(model, steps)
    if isinstance(stock, torch.Tensor):
        leading = leading_part(stock, tuple(region.tensor.shape))
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
