"""Is the stock stream a function of its input? Two stock copies, compared op by op.

Contract of this layer. A contract is only checkable against a reference that
reproduces itself: if two unmodified copies of a model, fed the same traffic, do not
return the same bytes, no bound copy can be "exact" against either of them. This
module answers that question for any ``StreamSpec`` (streams.py) and, when the answer
is no, says *where* the copies first part:

* ``reproduce_stream(spec, chunks)`` builds two stock copies in this process and
  drives both with the same seeded traffic, one chunk each in turn, each copy on its
  own random-number streams (paired_streams.py's ``RngStreams``: a model that draws sees the
  same numbers in both). Every output of every chunk is compared bit for bit. With
  ``trace=True`` (the default) every tensor operation both copies run is recorded
  through a ``TorchDispatchMode`` with the module it ran in (forward pre/post hooks
  keep the path), and after every chunk every tensor of the copies' streaming state
  (module attributes that are not parameters: caches, rings, offsets) is compared
  too. The first operation whose output differs while everything before it agreed is
  where the nondeterminism enters: its module path, the aten op, the output leaf,
  the first differing element with both values. Tracing stops there (everything
  after depends on it); outputs are compared to the end, so the report also says at
  which chunk the difference first reached what a user sees (a token ID, PCM).
* ``record_trace(spec, chunks, path)`` runs ONE copy and writes, per chunk, each
  operation's module path, op and a fingerprint of its outputs (two int64 sums of the
  outputs' bits) and the SHA-256 of each output; ``compare_records(a, b)`` finds the
  first difference between two such files (reproduce_records.py). Two fresh processes
  (``clockc reproduce --processes``) are the strongest test: allocator history,
  library handles and lazily chosen algorithms all start anew.

The trace itself (what one copy ran) is op_trace.py's; this module compares. The
trace reads tensor data and is slow (every op's outputs are kept or hashed); it is a
diagnostic, run before a contract is checked, never on the serving path.
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass, field
from typing import Any, Iterator

import torch

from ..audit import difference_box, first_difference, named_leaves
from .op_trace import (
    DEFAULT_KEEP_BYTES,
    OpTrace,
    _host_prints,
    _Op,
    _state_prints,
    state_tensors,
    weight_prints,
)
from ..progress import capture_progress
from .paired_streams import RngStreams, next_pair
from .streams import StreamSpec


@dataclass(frozen=True)
class OpDifference:
    """The first op (or state tensor) whose bytes differ between the two copies."""

    chunk: int
    kind: str  # "weights" (at build: chunk -1) | "op" | "state" | "control"
    index: int | None  # the op's position within the chunk (call order), None for state
    module: str  # the module the op ran in ("" at top level), or the state's path
    op: str  # the aten op ("" for state)
    leaf: int | None = None  # which output of the op
    shape: tuple[int, ...] | None = None
    dtype: str | None = None
    element: tuple[int, ...] | None = None
    first: Any = None  # copy A's value at ``element``
    second: Any = None  # copy B's
    count: int | None = None
    box: tuple[tuple[int, int], ...] = ()
    note: str = ""

    def describe(self) -> str:
        where = (
            f"op {self.op} in {self.module or '<top level>'}"
            if self.kind == "op"
            else (
                f"state {self.module}"
                if self.kind == "state"
                else f"control flow at op {self.index}"
            )
        )
        head = f"first difference: {where}, chunk {self.chunk}"
        if self.index is not None and self.kind == "op":
            head += f", op #{self.index} of the chunk, output {self.leaf}"
        parts = [self.note] if self.note else []
        if self.shape is not None:
            parts.append(f"tensor {list(self.shape)} {self.dtype}")
        if self.element is not None:
            parts.append(
                f"first differing element {self.element}: {self.first!r} vs {self.second!r}"
            )
        if self.box:
            span = ", ".join(f"{lo}:{hi + 1}" for lo, hi in self.box)
            parts.append(f"{self.count} elements differ, all within [{span}]")
        return head + "".join(f"\n  {p}" for p in parts)


@dataclass
class Reproduction:
    """What two stock copies did with the same traffic."""

    chunks: int
    device: str
    traced: bool
    compared: int = 0  # chunks whose outputs were compared
    output_divergence: dict | None = None  # {"chunk", "output", "note"}: what a user sees
    first_difference: OpDifference | None = None  # where it enters (traced runs)
    ops_per_chunk: list[int] = field(default_factory=list)
    state_tensors: int = 0
    mode: str = "copies"  # "copies" (one process) | "processes"
    traced_from: int = 0  # ops traced from this chunk; before it outputs and state only

    @property
    def reproducible(self) -> bool:
        return (
            self.output_divergence is None
            and self.first_difference is None
            and self.compared == self.chunks
        )

    def describe(self) -> str:
        what = "two stock copies" + (" in fresh processes" if self.mode == "processes" else "")
        if self.reproducible:
            traced = (
                f", every op ({sum(self.ops_per_chunk)}) and {self.state_tensors} state tensors"
                if self.traced
                else ""
            )
            return (
                f"reference reproducible: {what} on {self.device} returned the same bytes "
                f"for {self.compared}/{self.chunks} chunks (every output{traced})"
            )
        lines = [f"reference NOT reproducible: {what} on {self.device} differ"]
        if self.output_divergence is not None:
            d = self.output_divergence
            lines.append(f"  outputs first differ at chunk {d['chunk']}: {d['output']}")
        elif self.compared == self.chunks:
            lines.append(f"  outputs equal over all {self.chunks} chunks, but state differs")
        if self.first_difference is not None:
            lines.extend("  " + ln for ln in self.first_difference.describe().splitlines())
        if self.traced and self.traced_from:
            lines.append(
                f"  ops traced from chunk {self.traced_from}; the chunks before it compared "
                "outputs and state only"
            )
        lines.append(
            "  a bound copy cannot be checked against a reference that moves: pin the "
            "operation (a `determinism` setting, or a declared initial value) first"
        )
        return "\n".join(lines)

    def to_json(self) -> dict:
        out = dataclasses.asdict(self)
        out["reproducible"] = self.reproducible
        if self.first_difference is not None:
            out["first_difference"]["describe"] = self.first_difference.describe()
        return _jsonable(out)


# ================================================================ differences
def _weights_difference(a: dict, b: dict) -> OpDifference | None:
    for path, fa in a.items():
        if b.get(path) != fa:
            return OpDifference(-1, "weights", None, path, "",
                                note="the copies were built with other weights")  # fmt: skip
    return None


def _first_op_difference(chunk: int, a: list[_Op], b: list[_Op]) -> OpDifference | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if (x.module, x.op, x.shapes) != (y.module, y.op, y.shapes):
            return OpDifference(
                chunk, "control", i, y.module, y.op,
                note=f"copy A ran {x.op} {x.shapes} in {x.module or '<top>'}, "
                f"copy B {y.op} {y.shapes} in {y.module or '<top>'}",
            )  # fmt: skip
    if len(a) != len(b):
        return OpDifference(chunk, "control", min(len(a), len(b)), "", "",
                            note=f"copy A ran {len(a)} ops, copy B {len(b)}")  # fmt: skip
    # one host transfer per device for the whole chunk
    differs = [x != y for x, y in zip(_host_prints(a), _host_prints(b))]
    k = 0
    for i, (x, y) in enumerate(zip(a, b)):
        for leaf in range(len(x.prints)):
            if differs[k]:
                return _describe_op(chunk, i, leaf, x, y)
            k += 1
    return None


def _describe_op(chunk: int, i: int, leaf: int, x: _Op, y: _Op) -> OpDifference:
    shape, dtype = x.shapes[leaf]
    ta, tb = x.kept[leaf], y.kept[leaf]
    detail: dict[str, Any] = {}
    if ta is not None and tb is not None:
        ca, cb = ta.cpu(), tb.cpu()
        element = first_difference(ca, cb)
        count, box = difference_box(ca, cb)
        detail = dict(element=element, count=count, box=box)
        if element is not None:
            detail.update(first=ca[element].item(), second=cb[element].item())
    else:
        detail["note"] = "values not kept (past the trace's byte budget): fingerprints differ"
    output = x.outputs[leaf] if leaf < len(x.outputs) else leaf
    return OpDifference(chunk, "op", i, x.module, x.op, output, shape, dtype, **detail)


def _first_state_difference(chunk: int, a: Any, b: Any) -> OpDifference | None:
    sa, sb = state_tensors(a), state_tensors(b)
    pa, pb = _state_prints(a), _state_prints(b)
    for path in sa:
        if path in sb and pa[path] == pb.get(path) and sa[path].shape == sb[path].shape:
            continue  # equal fingerprints: the same bytes (details only for a difference)
        if path not in sb:
            return OpDifference(chunk, "state", None, path, "", note="missing in copy B")
        x, y = sa[path], sb[path]
        if x.shape != y.shape or x.dtype != y.dtype:
            return OpDifference(chunk, "state", None, path, "",
                                note=f"{tuple(x.shape)} {x.dtype} vs {tuple(y.shape)} {y.dtype}")  # fmt: skip
        ca, cb = x.detach().cpu(), y.detach().cpu()
        element = first_difference(ca, cb)
        if element is None:
            continue
        count, box = difference_box(ca, cb)
        values = dict(first=ca[element].item(), second=cb[element].item())
        return OpDifference(
            chunk, "state", None, path, "", None, tuple(x.shape),
            str(x.dtype).removeprefix("torch."), element, count=count, box=box, **values,
        )  # fmt: skip
    return None


# ==================================================================== two copies
def reproduce_stream(
    spec: StreamSpec,
    chunks: int,
    *,
    trace: bool = True,
    device: str | torch.device | None = None,
    keep_bytes: int = DEFAULT_KEEP_BYTES,
    progress: bool = False,
    trace_from: int = 0,
) -> Reproduction:
    """Two stock copies of ``spec`` in this process (module docstring). ``progress``: a
    bar on stderr, and each finding printed the moment it is made (a run stopped by a
    timeout has still said where the copies parted). ``trace_from``: ops are traced from
    that chunk on (a trace costs seconds per chunk of a large model); the chunks before
    it compare outputs and streaming state only, so a difference there is still found,
    at the first chunk whose state differs, without its op."""
    if chunks < 1:
        raise ValueError(f"chunks must be at least 1, got {chunks}")
    if not 0 <= trace_from < chunks:
        raise ValueError(f"trace_from must be in 0..{chunks - 1}, got {trace_from}")
    device = torch.device(device if device is not None else spec.device)
    first, second = spec.build(), spec.build()
    result = Reproduction(chunks, str(device), trace, traced_from=trace_from if trace else 0)
    result.first_difference = _weights_difference(weight_prints(first), weight_prints(second))
    traces = [OpTrace(first, keep_bytes), OpTrace(second, keep_bytes)] if trace else []
    for t in traces:
        # other weights: every op differs, nothing to trace
        t.active = result.first_difference is None and trace_from == 0
    rng = RngStreams(device)
    streams = [rng.wrap(n, _traced(spec.drive(m, chunks), t)) for n, m, t in
               zip(("stock", "bound"), (first, second), traces or (None, None))]  # fmt: skip
    bar = capture_progress(progress, "reproducing (two stock copies)", chunks)
    try:
        advance = bar.__enter__()
        for chunk in range(chunks):
            if chunk == trace_from and chunk and result.first_difference is None:
                for t in traces:
                    t.active = True
            found = next_pair(streams[0], streams[1], chunk)
            if not isinstance(found, tuple):
                result.output_divergence = {"chunk": chunk, "output": found.name,
                                            "note": found.note}  # fmt: skip
                break
            if result.first_difference is None:
                diff = None
                if traces and traces[0].active:
                    result.ops_per_chunk.append(len(traces[0].ops))
                    diff = _first_op_difference(chunk, traces[0].ops, traces[1].ops)
                if diff is None:
                    diff = _first_state_difference(chunk, first, second)
                    result.state_tensors = len(state_tensors(first))
                if diff is not None:
                    result.first_difference = diff
                    _say(progress, diff.describe())
                    for t in traces:  # what follows depends on it: outputs only from here
                        t.active = False
                        t.new_chunk()
            a, b = (named_leaves(x, "output") for x in found)
            differing = _first_differing_output(a, b)
            if differing is not None:
                result.output_divergence = {"chunk": chunk, "output": differing, "note": ""}
                _say(progress, f"outputs first differ at chunk {chunk}: {differing}")
                break
            result.compared = chunk + 1
            advance()
    finally:
        bar.__exit__(None, None, None)
        for s in streams:
            s.close()
        rng.restore()
        for t in traces:
            t.remove()
    return result


def _say(enabled: bool, text: str) -> None:
    if enabled:
        print(f"reproduce: {text}", file=sys.stderr, flush=True)


def _traced(stream: Iterator[Any], trace: OpTrace | None) -> Iterator[Any]:
    """``stream`` with ``trace`` active while each chunk is produced."""
    while True:
        if trace is not None:
            trace.new_chunk()
            with trace:
                item = next(stream, _DONE)
        else:
            item = next(stream, _DONE)
        if item is _DONE:
            return
        yield item


_DONE = object()


def _first_differing_output(a: dict, b: dict) -> str | None:
    from ..audit import bitwise_equal

    if list(a) != list(b):
        return f"output structure ({list(a)} vs {list(b)})"
    for path, x in a.items():
        y = b[path]
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
            if not bitwise_equal(x, y):
                return path
        elif not (type(x) is type(y) and x == y):
            return path
    return None


def _jsonable(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, float) and x != x:
        return "nan"
    if isinstance(x, (str, int, float, bool, type(None))):
        return x
    return repr(x)


__all__ = [
    "OpDifference",
    "Reproduction",
    "reproduce_stream",
]
