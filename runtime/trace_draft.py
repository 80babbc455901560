"""Trace a stock model's streaming loop and report what a contract would declare.

Contract of this layer: ``trace_stream(spec, chunks)`` runs the user's unmodified
streaming loop (a ``StreamSpec``) and returns a ``Trace``: plain data, no torch, that
``compiler/draft.py`` renders as a `.clock` draft. It never changes the model beyond
wrapping the hot callables' sites for the recording run, and it knows no model.

Two runs, each on a fresh ``spec.build()``:
  1. discovery (one chunk under ``sys.setprofile``): the *hot callables* are the
     outermost calls the loop makes into methods of objects in the model's own tree
     (``runtime/sites.py`` paths) with at least one tensor argument; a method of the
     model object itself counts only when the loop calls it from outside the model
     (a root method the loop calls with no tensor, such as a vendor ``stream()``, is
     the driver, and its calls are looked into). ``module(...)`` is ``forward``.
  2. recording (``chunks`` chunks): a wrapper at each hot site records every call's
     arguments as passed (positional or keyword), its result, which model tensors it
     wrote in place (version counters) and whether it drew randomness (a dispatch
     mode). A tensor argument is a *carry* when every call returns it grown along one
     axis by ``torch.cat`` (the input is the head or the tail of a result leaf) and the
     loop passes back the next call either that leaf or a head ++ tail trim of it
     (found by comparing elements); its clock stride is the growth per call, its
     attended start the first call's extent and its retention the trim.

What a trace cannot see is returned as ``notes`` (the draft prints them): retention
never exercised within ``chunks``, turn boundaries, configurations the loop did not
reach (a final chunk), demand extents of scratch buffers, host syncs.
"""

from __future__ import annotations

import gc
import inspect
import sys
from dataclasses import dataclass, field
from typing import Any, Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .sites import Step, format_path, get_at, set_at
from .streams import StreamSpec

# aten ops that draw from a generator (by name: every variant of these families does)
_RANDOM_OPS = ("rand", "normal", "bernoulli", "uniform", "multinomial", "exponential", "poisson")
_CALL_WRAPPERS = ("_wrapped_call_impl", "_call_impl", "__call__")
_MAX_DEPTH = 12


@dataclass(frozen=True)
class Layout:
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int

    @property
    def contiguous(self) -> bool:
        expected, size = [], 1
        for n in reversed(self.shape):
            expected.insert(0, size)
            size *= n
        return all(s == e or n == 1 for s, e, n in zip(self.stride, expected, self.shape))


@dataclass
class ArgFinding:
    """One leaf of a callable's arguments: `keyword` root name or positional `label`."""

    keyword: bool
    root: str  # the parameter name (positional: a label; its order is the index)
    steps: tuple[Step, ...]  # inside the root (dict keys, indices)
    kind: str  # "tensor" | "scalar" | "carry"
    dtype: str | None = None
    layouts: list[Layout] = field(default_factory=list)  # per call
    values: list[Any] = field(default_factory=list)  # scalars, per call
    carry: str | None = None  # the carry's label


@dataclass
class CarryFinding:
    label: str  # the argument leaf's own name (last key or parameter)
    dtype: str
    shape: tuple[int, ...]  # off-axis dims; the axis entry is the retained extent
    axis: int
    extents: list[int]  # attended extent at every call
    stride: int  # frames appended per call
    order: str  # "append" (new frames last) | "prepend" (newest first)
    retention: tuple[str, tuple[int, ...]] | None  # ("window", (W,)) | ("head_tail", (P, R))
    site: tuple[Step, ...] | None  # where the loop keeps it on the model
    result: tuple[Step, ...]  # the result leaf holding the grown history
    callable: str


@dataclass
class BufferFinding:
    """A model tensor a hot callable writes in place (address kept across calls)."""

    site: tuple[Step, ...]
    dtype: str
    shape: tuple[int, ...]
    read_back: bool  # a later call's argument views it: state kept in place
    writers: set[str] = field(default_factory=set)


@dataclass
class CallableFinding:
    name: str
    site: tuple[Step, ...]
    calls_per_chunk: int
    args: list[ArgFinding]
    randomness: bool = False
    autocast: set[str] = field(default_factory=set)
    note: str = ""


@dataclass
class Trace:
    model: str  # the model's class name
    chunks: int
    callables: list[CallableFinding]
    carries: list[CarryFinding]
    buffers: list[BufferFinding]
    notes: list[str]


# --------------------------------------------------------------------- the tree
def _children(obj: Any) -> Iterator[tuple[Step, Any]]:
    if isinstance(obj, torch.nn.Module):
        for table in ("_parameters", "_buffers", "_modules"):
            for k, v in obj.__dict__.get(table, {}).items():
                if v is not None:
                    yield ("attr", k), v
    if isinstance(obj, dict):
        for k, v in obj.items():
            if isinstance(k, str):
                yield ("key", k), v
        return
    if isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield ("index", i), v
        return
    for k, v in (getattr(obj, "__dict__", None) or {}).items():
        if (
            isinstance(k, str)
            and not k.startswith("__")
            and k not in ("_parameters", "_buffers", "_modules")
        ):
            yield ("attr", k), v


def _walk(
    model: Any,
) -> tuple[dict[int, tuple[Step, ...]], list[tuple[tuple[Step, ...], torch.Tensor]]]:
    """(objects of the tree by id -> path, tensors of the tree with their paths)."""
    objects: dict[int, tuple[Step, ...]] = {}
    tensors: list[tuple[tuple[Step, ...], torch.Tensor]] = []
    stack: list[tuple[tuple[Step, ...], Any]] = [((), model)]
    while stack:
        path, obj = stack.pop()
        if isinstance(obj, torch.Tensor):
            if not isinstance(obj, torch.nn.Parameter):
                tensors.append((path, obj))
            continue
        if id(obj) in objects or len(path) > _MAX_DEPTH:
            continue
        if isinstance(obj, (str, bytes, int, float, bool, type(None))) or inspect.isroutine(obj):
            continue
        if inspect.ismodule(obj) or inspect.isclass(obj):
            continue
        objects[id(obj)] = path
        stack.extend((path + (step,), child) for step, child in _children(obj))
    return objects, tensors


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
@dataclass
class _Call:
    chunk: int
    args: tuple
    kwargs: dict
    inputs: dict[tuple, torch.Tensor]  # leaf key -> clone of the input at entry
    where: dict[tuple, tuple] = field(default_factory=dict)  # leaf key -> model path at entry
    result: Any = None
    wrote: set = field(default_factory=set)  # paths of model tensors written in place
    autocast: str = "off"


def _leaves(
    value: Any, steps: tuple[Step, ...] = (), depth: int = 0
) -> Iterator[tuple[tuple[Step, ...], Any]]:
    if isinstance(value, dict) and depth < 4:
        for k, v in value.items():
            if isinstance(k, str):
                yield from _leaves(v, steps + (("key", k),), depth + 1)
    elif isinstance(value, (list, tuple)) and depth < 4 and not isinstance(value, torch.Size):
        for i, v in enumerate(value):
            yield from _leaves(v, steps + (("index", i),), depth + 1)
    else:
        yield steps, value


def _arg_leaves(call: _Call, names: list[str]) -> Iterator[tuple[tuple, Any]]:
    """((keyword, root, steps), value) for every leaf, positional roots labelled."""
    for i, v in enumerate(call.args):
        root = names[i] if i < len(names) else f"arg{i}"
        for steps, leaf in _leaves(v):
            yield (False, root, steps), leaf
    for k, v in call.kwargs.items():
        for steps, leaf in _leaves(v):
            yield (True, k, steps), leaf


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
    calls: dict[str, list[_Call]] = {names[s]: [] for s in sites}
    params: dict[str, list[str]] = {}
    chunk = [0]
    recorder = _Recorder()
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
            _recording(model, name, stock, params[name], calls[name], chunk, recorder, spec.device),
        )
    outputs = spec.drive(model, chunks)
    with recorder:
        for _ in outputs:
            chunk[0] += 1
            if chunk[0] >= chunks:
                break
    return _findings(model, sites, names, calls, params, recorder, chunk[0] or chunks)


def _version(t: torch.Tensor) -> int | None:
    try:
        return t._version
    except RuntimeError:  # an inference tensor keeps no version counter
        return None


def _recording(model, name, stock, params, record, chunk, recorder, device):
    def call(*args, **kwargs):
        entry = _Call(
            chunk[0], args, kwargs, {}, autocast=_autocast_state(torch.device(device).type)
        )
        _, before = _walk(model)
        paths = {id(t): p for p, t in before}
        for key, leaf in _arg_leaves(entry, params):
            if isinstance(leaf, torch.Tensor):
                entry.inputs[key] = leaf.detach().clone()
                entry.where[key] = paths.get(id(leaf))
        versions = {id(t): (p, _version(t)) for p, t in before}
        recorder.active = name
        try:
            entry.result = stock(*args, **kwargs)
        finally:
            recorder.active = None
        _, after = _walk(model)
        for p, t in after:
            seen = versions.get(id(t))
            if seen is not None and seen[1] is not None and _version(t) != seen[1]:
                entry.wrote.add(p)
        record.append(entry)
        return entry.result

    return call


def _callable_name(site: tuple[Step, ...]) -> str:
    parts = [str(v) for k, v in site if k == "attr"]
    if parts and parts[-1] == "forward" and len(parts) > 1:
        parts = parts[:-1]
    return "_".join(parts[-2:]) if len(parts) > 1 else parts[0]


# -------------------------------------------------------------------- findings
def _grown(inp: torch.Tensor, out: torch.Tensor) -> list[tuple[int, str]]:
    """[(axis, order)] for each way ``out`` is ``inp`` with frames added along one axis."""
    if inp.dim() != out.dim() or inp.dtype != out.dtype or inp.dim() == 0:
        return []
    diff = [d for d in range(inp.dim()) if inp.shape[d] != out.shape[d]]
    if len(diff) != 1 or out.shape[diff[0]] <= inp.shape[diff[0]]:
        return []
    axis, n = diff[0], inp.shape[diff[0]]
    found = []
    if torch.equal(out.narrow(axis, 0, n), inp):
        found.append((axis, "append"))
    if torch.equal(out.narrow(axis, out.shape[axis] - n, n), inp):
        found.append((axis, "prepend"))
    return found


def _trim_heads(kept: torch.Tensor, history: torch.Tensor, axis: int) -> set[int] | None:
    """Every head P with ``kept == cat(history[:P], history[-(L-P):])`` along ``axis``."""
    n, L = history.shape[axis], kept.shape[axis]
    if L > n or any(kept.shape[d] != history.shape[d] for d in range(kept.dim()) if d != axis):
        return None
    if L == 0:
        return {0}
    others = tuple(d for d in range(kept.dim()) if d != axis)

    def frames_equal(a, b):
        eq = a == b
        return eq.all(dim=others) if others else eq

    head_ok = frames_equal(kept, history.narrow(axis, 0, L)).tolist()
    tail_ok = frames_equal(kept, history.narrow(axis, n - L, L)).tolist()
    p_max = next((i for i, ok in enumerate(head_ok) if not ok), L)
    s_max = next((j for j, ok in enumerate(reversed(tail_ok)) if not ok), L)
    heads = set(range(max(0, L - s_max), p_max + 1))
    return heads or None


def _findings(model, sites, names, calls, params, recorder, chunks) -> Trace:
    notes: list[str] = []
    carries: list[CarryFinding] = []
    callables: list[CallableFinding] = []
    buffers: dict[tuple, BufferFinding] = {}
    for site in sites:
        name = names[site]
        record = calls[name]
        if not record:
            notes.append(f"{format_path(site)} was called in discovery but not while recording")
            continue
        per_chunk = {c.chunk for c in record}
        counts = [sum(c.chunk == k for c in record) for k in sorted(per_chunk)]
        finding = CallableFinding(
            name,
            site,
            counts[0],
            [],
            randomness=name in recorder.random,
            autocast={c.autocast for c in record},
        )
        if len(set(counts)) != 1:
            notes.append(
                f"{name} is called {sorted(set(counts))} times per chunk: drafted at {counts[0]}"
            )
        leaves = [dict(_arg_leaves(c, params[name])) for c in record]
        keys = list(leaves[0])
        for key in keys:
            if any(key not in lv for lv in leaves):
                notes.append(
                    f"{name}: argument {_shown(key)} is not passed on every call: left out"
                )
                continue
            values = [lv[key] for lv in leaves]
            keyword, root, steps = key
            arg = ArgFinding(keyword, root, steps, "scalar")
            if all(isinstance(v, torch.Tensor) for v in values):
                arg.kind, arg.dtype = "tensor", str(values[0].dtype).replace("torch.", "")
                arg.layouts = [
                    Layout(tuple(v.shape), tuple(v.stride()), v.storage_offset()) for v in values
                ]
                carry = _carry(name, key, record, values, notes)
                if carry is not None:
                    arg.kind, arg.carry = "carry", carry.label
                    carries.append(carry)
            elif all(v is None or isinstance(v, (bool, int, float)) for v in values):
                arg.values = values
            else:
                notes.append(
                    f"{name}: argument {_shown(key)} is neither a tensor nor a scalar: left out"
                )
                continue
            finding.args.append(arg)
        for c in record:
            for p in c.wrote:
                b = buffers.get(p)
                if b is None:
                    t = get_at(model, p)
                    b = buffers[p] = BufferFinding(
                        p, str(t.dtype).replace("torch.", ""), tuple(t.shape), False
                    )
                b.writers.add(name)
        callables.append(finding)
    carried_sites = {c.site for c in carries}
    for p, b in list(buffers.items()):
        if p in carried_sites:
            del buffers[p]
            continue
        storage = get_at(model, p).untyped_storage().data_ptr()
        b.read_back = any(
            isinstance(v, torch.Tensor) and v.untyped_storage().data_ptr() == storage
            for record in calls.values()
            for c in record[1:]
            for _, v in _arg_leaves(c, [])
        )
    return Trace(type(model).__name__, chunks, callables, carries, list(buffers.values()), notes)


def _shown(key: tuple) -> str:
    keyword, root, steps = key
    return root + format_path(steps) if steps and steps[0][0] != "attr" else root


def _carry(name, key, record, values, notes) -> CarryFinding | None:
    """A carry finding for one tensor argument leaf, or None (module docstring)."""
    # the result leaf that is this input grown, the same one on every call (an empty
    # input "grows" into every leaf of its shape, so calls narrow the candidates down)
    candidates: set[tuple] | None = None
    added_by_call: list[dict[tuple, int]] = []
    for c in record:
        inp = c.inputs.get(key)
        hits: dict[tuple, int] = {}
        for rsteps, out in _leaves(c.result):
            if isinstance(out, torch.Tensor) and inp is not None:
                for axis, order in _grown(inp, out):
                    hits[(rsteps, axis, order)] = out.shape[axis] - inp.shape[axis]
        candidates = set(hits) if candidates is None else candidates & set(hits)
        added_by_call.append(hits)
        if not candidates:
            return None
    if len(candidates) != 1:
        orders = {c[:2] for c in candidates}
        if len(orders) != 1:
            return None
        candidates = {min(candidates, key=lambda c: c[2])}  # never grown past empty: append
    (chosen,) = candidates
    rsteps, axis, order = chosen
    added = {hits[chosen] for hits in added_by_call}
    if len(added) != 1:
        notes.append(
            f"{name}: {_shown(key)} grows by {sorted(added)} frames per call: not drafted as a carry"
        )
        return None
    extents = [v.shape[axis] for v in values]
    heads: set[int] | None = None
    trimmed = False
    for prev, nxt in zip(record, values[1:]):
        history = _leaf_at(prev.result, rsteps)
        if history is nxt or (history.data_ptr() == nxt.data_ptr() and history.shape == nxt.shape):
            continue
        if nxt.shape[axis] == history.shape[axis]:
            continue  # an equal copy: no trim
        found = _trim_heads(nxt, history, axis)
        if found is None:
            notes.append(
                f"{name}: {_shown(key)} is not a head ++ tail of the last result: not a carry"
            )
            return None
        trimmed = True
        heads = found if heads is None else heads & found
    label = str(key[2][-1][1]) if key[2] else key[1]
    if not trimmed or not heads:
        notes.append(
            f"{name}: {_shown(key)} grew by {added.pop()} per call and was never trimmed in "
            f"{len(record)} calls: staged as a plain argument; run more chunks (or declare its retention)"
        )
        return None
    kept = max(extents)
    head = max(heads) if order == "append" else min(heads)
    retention = ("window", (kept,)) if head == 0 else ("head_tail", (head, kept - head))
    if len(heads) > 1:
        notes.append(f"{label}: the trim fits heads {sorted(heads)}; drafted head {head}")
    found_at = {c.where.get(key) for c in record} - {None}
    site = found_at.pop() if len(found_at) == 1 else None
    if site is None:
        notes.append(f"{label}: the loop keeps it at no single model path: drafted without a site")
    shape = list(values[-1].shape)
    shape[axis] = kept
    return CarryFinding(
        label,
        str(values[0].dtype).replace("torch.", ""),
        tuple(shape),
        axis,
        extents,
        added.pop(),
        order,
        retention,
        site,
        rsteps,
        name,
    )


def _leaf_at(value: Any, steps: tuple[Step, ...]) -> Any:
    for _, k in steps:
        value = value[k]
    return value
