"""Trace a stock model's streaming loop and report what a contract would declare.

Contract of this layer: ``trace_stream(spec, chunks)`` runs the user's unmodified
streaming loop (a ``StreamSpec``) and returns a ``Trace`` (``draft_findings.py``:
plain data, no torch) that ``compiler/draft.py`` renders as a `.clock` draft. It never
changes the model beyond wrapping the hot callables' sites for the recording run, and
it knows no model. It runs and records; what the record implies (carries, buffers) is
inferred in ``draft_findings.py``.

Two runs, each on a fresh ``spec.build()``:
  1. discovery (one chunk under ``sys.setprofile``): the *hot callables* are the
     outermost calls the loop makes into methods of objects in the model's own tree
     (``runtime/state/sites.py`` paths) with at least one tensor argument; a method of the
     model object itself counts only when the loop calls it from outside the model
     (a root method the loop calls with no tensor, such as a vendor ``stream()``, is
     the driver, and its calls are looked into). ``module(...)`` is ``forward``.
  2. recording (``chunks`` chunks): a wrapper at each hot site records every call's
     arguments as passed (positional or keyword), its result, which model tensors it
     wrote in place (version counters), the autocast state it ran under and whether it
     drew randomness (a dispatch mode).

What a trace cannot see is returned as ``notes`` (the draft prints them): retention
never exercised within ``chunks``, turn boundaries, configurations the loop did not
reach (a final chunk), demand extents of scratch buffers, host syncs.
"""

from __future__ import annotations

import gc
import inspect
import sys
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .draft_findings import RecordedCall, Trace, arg_leaves, infer_findings
from ..state.object_tree import walk as _walk
from ..state.sites import Step, get_at, set_at
from ..state.trees import map_tensors
from .streams import StreamSpec

# aten ops that draw from a generator (by name: every variant of these families does)
_RANDOM_OPS = ("rand", "normal", "bernoulli", "uniform", "multinomial", "exponential", "poisson")
_CALL_WRAPPERS = ("_wrapped_call_impl", "_call_impl", "__call__")


# ------------------------------------------------------------------ discovery
def _tensor_in(value: Any, depth: int = 0) -> bool:
    if isinstance(value, torch.Tensor):
        return True
    if depth > 4:
        return False
    if isinstance(value, dict):
        return any(_tensor_in(v, depth + 1) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(_tensor_in(v, depth + 1) for v in value)
    return False


def discover(spec: StreamSpec) -> list[tuple[Step, ...]]:
    """Sites of the hot callables, in the order of their first call (module docstring)."""
    model = spec.build()
    objects, _ = _walk(model)
    found: list[tuple[Step, ...]] = []
    inside: list[Any] = []

    def profile(frame, event, arg):
        if event == "return" and inside and frame is inside[0]:
            inside.clear()
        if event != "call" or inside:
            return
        code = frame.f_code
        if code.co_argcount == 0 or code.co_varnames[0] != "self":
            return
        if code.co_name.startswith("__") and code.co_name not in _CALL_WRAPPERS:
            return  # attribute protocol (`model.state = ...`), not a call of the model
        local = frame.f_locals
        obj = local.get("self")
        path = objects.get(id(obj))
        if path is None:
            return
        if obj is model:
            caller = frame.f_back
            caller_self = caller.f_locals.get("self") if caller is not None else None
            if id(caller_self) in objects:
                return  # a helper of the model's own driver method
        values = [v for k, v in local.items() if k != "self"]
        if not _tensor_in(values):
            return  # a driver: look into its calls
        name = "forward" if code.co_name in _CALL_WRAPPERS else code.co_name
        site = path + (("attr", name),)
        if site not in found:
            found.append(site)
        inside.append(frame)

    chunks = spec.drive(model, 1)
    sys.setprofile(profile)
    try:
        next(iter(chunks), None)
    finally:
        sys.setprofile(None)
    return found


# ------------------------------------------------------------------ recording
class _Recorder(TorchDispatchMode):
    """Notes random ops while a hot callable runs."""

    def __init__(self) -> None:
        super().__init__()
        self.active: str | None = None
        self.random: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self.active is not None and any(r in func.__name__ for r in _RANDOM_OPS):
            self.random.add(self.active)
        return func(*args, **(kwargs or {}))


def _autocast_state(device: str) -> str:
    try:
        if torch.is_autocast_enabled(device):
            return str(torch.get_autocast_dtype(device)).replace("torch.", "")
    except (RuntimeError, TypeError):
        pass
    return "off"


def trace_stream(spec: StreamSpec, chunks: int) -> Trace:
    """Discover the hot callables, then record ``chunks`` chunks (module docstring)."""
    if chunks < 2:
        raise ValueError("draft needs at least 2 chunks to see state carried across calls")
    sites = discover(spec)
    gc.collect()  # the discovery copy goes before the recorded one is built
    model = spec.build()
    names = {site: _callable_name(site) for site in sites}
    calls: dict[str, list[RecordedCall]] = {names[s]: [] for s in sites}
    params: dict[str, list[str]] = {}
    chunk = [0]
    recorder = _Recorder()
    results = _Results()
    for site in sites:
        stock = get_at(model, site)
        name = names[site]
        try:
            params[name] = list(inspect.signature(stock).parameters)
        except (TypeError, ValueError):
            params[name] = []
        set_at(
            model,
            site,
            _recording(
                model, name, stock, params[name], calls[name], chunk, recorder, spec.device, results
            ),
        )
    outputs = spec.drive(model, chunks)
    with recorder:
        for _ in outputs:
            chunk[0] += 1
            if chunk[0] >= chunks:
                break
    return infer_findings(model, sites, names, calls, params, recorder.random, chunk[0] or chunks)


def _version(t: torch.Tensor) -> int | None:
    try:
        return t._version
    except RuntimeError:  # an inference tensor keeps no version counter
        return None


class _Results:
    """The recorded results, as they were when their calls returned. A result is kept
    by reference (a copy of every one would double the trace's memory), but stock code
    often returns views of buffers that a later call rewrites in place (Token2Wav's flow
    returns its new attention caches as views of the workspace ``att_cache_buffer``):
    before every hot call, each kept result's leaf that shares storage with a tensor of
    the model's tree or with an argument of that call, which the call may write, is
    replaced by a copy of itself."""

    def __init__(self) -> None:
        self.kept: list[RecordedCall] = []

    def keep(self, entry: RecordedCall, result: Any) -> None:
        entry.result = map_tensors(result, lambda t: t, copy=True)  # containers: ours
        self.kept.append(entry)

    def before_call(self, model_tensors: list, args: tuple, kwargs: dict) -> None:
        writable = {t.untyped_storage().data_ptr() for _, t in model_tensors}
        for leaf in _tensor_leaves((args, kwargs)):
            writable.add(leaf.untyped_storage().data_ptr())

        def own(t: torch.Tensor) -> torch.Tensor:
            if t.untyped_storage().data_ptr() in writable:
                return t.detach().clone()
            return t

        for entry in self.kept:
            entry.result = map_tensors(entry.result, own)


def _tensor_leaves(x: Any) -> list[torch.Tensor]:
    found: list[torch.Tensor] = []
    map_tensors(x, lambda t: found.append(t) or t, copy=True)
    return found


def _recording(model, name, stock, params, record, chunk, recorder, device, results):
    def call(*args, **kwargs):
        entry = RecordedCall(
            chunk[0], args, kwargs, {}, autocast=_autocast_state(torch.device(device).type)
        )
        objects, before = _walk(model, entry.ints)
        results.before_call(before, args, kwargs)
        paths = {id(t): p for p, t in before}
        for key, leaf in arg_leaves(entry, params):
            if isinstance(leaf, torch.Tensor):
                entry.inputs[key] = leaf.detach().clone()
                entry.where[key] = paths.get(id(leaf))
            elif id(leaf) in objects and objects[id(leaf)]:
                # an object the model holds (a cache): its tensors, by steps inside it
                at = objects[id(leaf)]
                inside = {
                    p[len(at) :]: (tuple(t.shape), id(t)) for p, t in before if p[: len(at)] == at
                }
                entry.held[key] = (at, inside)
        versions = {id(t): (p, _version(t)) for p, t in before}
        recorder.active = name
        try:
            result = stock(*args, **kwargs)
            results.keep(entry, result)
        finally:
            recorder.active = None
        ints_after: dict = {}
        _, after = _walk(model, ints_after)
        # host ints the call moved (a step count, a cache's cumulative_length)
        entry.advanced = {
            p: ints_after[p] - v for p, v in entry.ints.items() if ints_after.get(p, v) != v
        }
        for p, t in after:
            seen = versions.get(id(t))
            if seen is not None and seen[1] is not None and _version(t) != seen[1]:
                entry.wrote.add(p)
        record.append(entry)
        return result

    return call


def _callable_name(site: tuple[Step, ...]) -> str:
    parts = [str(v) for k, v in site if k == "attr"]
    if parts and parts[-1] == "forward" and len(parts) > 1:
        parts = parts[:-1]
    return "_".join(parts[-2:]) if len(parts) > 1 else parts[0]
