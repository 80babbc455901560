"""What a recorded streaming run implies for a contract: carries, in-place buffers, effects.

Contract of this layer: ``infer_findings`` reads the calls ``trace_draft.py`` recorded
at each hot callable (``RecordedCall``: the arguments as passed, clones of the tensor
inputs at entry and their model paths, the result, the model tensors written in place,
the autocast state) and returns a ``Trace``: plain data, no torch, that
``compiler/draft.py`` renders as a `.clock` draft. It runs nothing of the model and
knows no model; it only compares what was recorded.

  * every argument leaf is a tensor (its layouts per call), a scalar (its values) or
    left out with a note;
  * a tensor argument is a *carry* when every call returns it grown along one axis by
    ``torch.cat`` (the input is the head or the tail of a result leaf) and the loop
    passes back the next call either that leaf or a head ++ tail trim of it (found by
    comparing elements); its clock stride is the growth per call, its attended start
    the first call's extent and its retention the trim;
  * a model tensor a call wrote in place (its version counter moved) is a buffer,
    ``read_back`` when a later call's argument views its storage; a carry's own site
    is not one;
  * randomness and autocast states are the recorder's, per callable.

What a recording cannot show is returned as ``notes`` (the draft prints them):
retention never exercised within the chunks run, arguments not passed on every call,
a carry kept at no single model path, calls per chunk that vary, host ints that move
by varying amounts; and what makes a trace prove little: a result the same on every
call (random weights that leave a codebook at zero).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterator

import torch

from ..state.sites import Step, format_path, get_at
from .draft_host import CounterFinding, constant_results, counters, held_object
from .draft_host import shown as _shown


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
    # arguments the call passes that a contract cannot key (why, each): replay keys every
    # argument, so with one of these the call would miss on every call
    unkeyed: list[str] = field(default_factory=list)
    counters: list[CounterFinding] = field(default_factory=list)


@dataclass
class Trace:
    model: str  # the model's class name
    chunks: int
    callables: list[CallableFinding]
    carries: list[CarryFinding]
    buffers: list[BufferFinding]
    notes: list[str]


# ------------------------------------------------------------------ recorded calls
@dataclass
class RecordedCall:
    """One call of a hot callable as the recording run saw it."""

    chunk: int
    args: tuple
    kwargs: dict
    inputs: dict[tuple, torch.Tensor]  # leaf key -> clone of the input at entry
    where: dict[tuple, tuple] = field(default_factory=dict)  # leaf key -> model path at entry
    result: Any = None
    wrote: set = field(default_factory=set)  # paths of model tensors written in place
    autocast: str = "off"
    ints: dict = field(default_factory=dict)  # path -> host int attribute at entry
    advanced: dict = field(default_factory=dict)  # path -> how far the call moved it
    # leaf key -> (model path, {steps inside it: tensor shape}) of an argument that is an
    # object of the model's tree (a transformers cache), as it was at entry
    held: dict = field(default_factory=dict)


def _leaves(
    value: Any, steps: tuple[Step, ...] = (), depth: int = 0
) -> Iterator[tuple[tuple[Step, ...], Any]]:
    """(steps, leaf) of a nested value: dicts by string key, lists and tuples by index."""
    if isinstance(value, dict) and depth < 4:
        for k, v in value.items():
            if isinstance(k, str):
                yield from _leaves(v, steps + (("key", k),), depth + 1)
    elif isinstance(value, (list, tuple)) and depth < 4 and not isinstance(value, torch.Size):
        for i, v in enumerate(value):
            yield from _leaves(v, steps + (("index", i),), depth + 1)
    else:
        yield steps, value


def arg_leaves(call: RecordedCall, names: list[str]) -> Iterator[tuple[tuple, Any]]:
    """((keyword, root, steps), value) for every leaf, positional roots labelled."""
    for i, v in enumerate(call.args):
        root = names[i] if i < len(names) else f"arg{i}"
        for steps, leaf in _leaves(v):
            yield (False, root, steps), leaf
    for k, v in call.kwargs.items():
        for steps, leaf in _leaves(v):
            yield (True, k, steps), leaf


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


def infer_findings(model, sites, names, calls, params, random, chunks) -> Trace:
    """The trace of a recording run: per hot site (`sites`, named by `names`), its
    recorded `calls` and parameter names; `random`: the callables that drew randomness."""
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
            randomness=name in random,
            autocast={c.autocast for c in record},
        )
        if len(set(counts)) != 1:
            notes.append(
                f"{name} is called {sorted(set(counts))} times per chunk: drafted at {counts[0]}"
            )
        finding.counters, moved = counters(record)
        for path, deltas in moved.items():
            notes.append(
                f"{name}: host int {format_path(path)} moved by {sorted(set(deltas))} per call: "
                "not a counter (a graph would freeze it; declare what it decides)"
            )
        leaves = [dict(arg_leaves(c, params[name])) for c in record]
        keys = list(leaves[0])
        for key in keys:
            if any(key not in lv for lv in leaves):
                notes.append(
                    f"{name}: argument {_shown(key)} is not passed on every call: left out"
                )
                finding.unkeyed.append(f"argument {_shown(key)} is not passed on every call")
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
                kind = type(values[0]).__name__
                notes.append(
                    f"{name}: argument {_shown(key)} is neither a tensor nor a scalar "
                    f"({kind}): left out"
                )
                held = held_object(name, key, record)
                if held is not None:
                    notes.append(held)
                finding.unkeyed.append(f"argument {_shown(key)} is a {kind}")
                continue
            finding.args.append(arg)
        for steps in constant_results([dict(_leaves(c.result)) for c in record]):
            notes.append(
                f"{name}: result{format_path(steps)} was the same on all {len(record)} calls; "
                "a stream whose outputs never change proves nothing bit for bit (random "
                "weights can leave a codebook or a gate at zero: fill it with small random "
                "values)"
            )
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
            for _, v in arg_leaves(c, [])
        )
    return Trace(type(model).__name__, chunks, callables, carries, list(buffers.values()), notes)


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
    for prev, nxt, call in zip(record, values[1:], record[1:]):
        history = _leaf_at(prev.result, rsteps)
        if history is nxt or (history.data_ptr() == nxt.data_ptr() and history.shape == nxt.shape):
            continue
        # the argument as it was passed (a view of a buffer the call then rewrote holds
        # that call's writes now; the recording cloned it on the way in)
        nxt = call.inputs.get(key, nxt)
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
