"""What a CUDA graph freezes of a call's host side, recorded so the simulate backend can
fail where a real graph would.

Contract of this layer. A graph replays the kernels its capture launched with the
arguments they had then: the integers, floats and shapes the Python body computed, and
the device addresses it read. Eager calls recompute all of that. The simulate backend
(``backend.FakeGraphBackend``) re-runs the Python body on every "replay", so by itself it
recomputes host-derived values — rotary positions from a host offset, a slice bounded by
a Python counter, an attribute rebound to a new tensor each call — and passes a contract
whose real graph bakes the capture's values and silently returns other bytes.

``HostProgram`` closes that gap, and on every backend capture uses it too
(``replay_capture.py``): the capture call is checked against the eager call just before
it, so a host value that moves between calls is refused before any graph replays it. While the capture call runs, a ``TorchDispatchMode``
writes down, for every op the body hands the dispatcher, its name and the host side of
its arguments:

* every non-tensor argument (ints, floats, bools, dtypes, devices, shapes, ...), as is;
* every tensor argument made by an earlier op of the same call, by its position in the
  call (internal: a graph keeps it at a fixed address of its pool);
* every other tensor argument (an input, a parameter, a region, module state) by its
  address, shape, strides and dtype: a graph reads that address and no other;
* a tensor made from host data inside the call (``torch.tensor(...)``: ``lift_fresh``)
  by its values: a graph bakes them.

Each simulated replay runs the body under the same mode and compares op by op (in
the capture's autograd context; a replay in another one, say under inference mode,
where composite ops decompose otherwise, against the first replay in it). The
first difference — another value, another address, another op (a host branch taken the
other way), more or fewer ops — is what a real graph would have frozen: the replay
finishes (its outputs are an eager call's, so nothing the caller sees is wrong) and
raises ``StaleHostValue`` naming the op, the argument, both values and the line of
model code that made the call; the engine then takes the callable out of replay
(``replay.py``: reason ``stale_host_value``).
"""

from __future__ import annotations

import hashlib
import traceback
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils._pytree import tree_flatten

# ops that make a tensor from host data: compared by value, not by address
_FROM_HOST = frozenset({"aten.lift_fresh", "aten.lift_fresh_copy"})
_TORCH_DIR = str(Path(torch.__file__).parent)
# the runtime's own frames (this module, the engine, hoist's mode) are never the model's
_RUNTIME_DIR = str(Path(__file__).resolve().parent.parent)


class StaleHostValue(RuntimeError):
    """A simulated replay met a host value other than its capture's: a real graph would
    have replayed the capture's value (the message names the op, the argument, both)."""


@dataclass(frozen=True)
class _OpRecord:
    op: str
    args: tuple  # one entry per flattened argument leaf (module docstring)


class HostProgram(TorchDispatchMode):
    """Record (``expected=None``) or check (``expected``: a recorded program) the host side
    of one call, op by op. After a checking run ``difference`` is None or what differed."""

    def __init__(
        self,
        expected: list[_OpRecord] | None = None,
        *,
        now: str = "now",
        then: str = "at capture",
    ) -> None:
        super().__init__()
        self.expected = expected
        # how a difference names this call and the recorded one
        self.now, self.then = now, then
        self.ops: list[_OpRecord] = []
        # tensors made by this call's ops, by id (weak: a freed one is not kept alive,
        # and a reused id is told apart by identity)
        self._made: weakref.WeakValueDictionary[int, torch.Tensor] = weakref.WeakValueDictionary()
        self._index: dict[int, int] = {}
        self._count = 0  # tensors made so far (ids are reused: not len(_index))
        self.difference: str | None = None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        if torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), "CompositeImplicitAutograd"):
            # a composite op reaches this mode whole or as its parts depending on grad and
            # inference mode (conv1d or convolution): record its parts, always (they are
            # what runs next either way)
            with self:
                out = func.decompose(*args, **kwargs)
            if out is not NotImplemented:
                return out
        name = str(func.overloadpacket)
        leaves, _ = tree_flatten((args, kwargs))
        record = _OpRecord(str(func), tuple(self._host_side(name, x) for x in leaves))
        out = func(*args, **kwargs)
        if self.difference is None:
            self._compare(record)
        self.ops.append(record)
        out_leaves, _ = tree_flatten(out)
        for t in out_leaves:
            if isinstance(t, torch.Tensor):
                self._index[id(t)] = self._count
                self._made[id(t)] = t
                self._count += 1
        return out

    def _host_side(self, name: str, x: Any) -> tuple:
        if not isinstance(x, torch.Tensor):
            return ("value", _plain(x))
        if self._made.get(id(x)) is x:
            return ("made", self._index[id(x)])
        if name in _FROM_HOST:
            # (a device tensor's values cannot be read inside a capture: its shape then)
            digest = _values_digest(x) if x.device.type == "cpu" else f"on {x.device.type}"
            return ("host data", digest, tuple(x.shape), str(x.dtype))
        ptr = x.data_ptr() if x.numel() else 0
        return ("address", ptr, tuple(x.shape), tuple(x.stride()), str(x.dtype))

    def _compare(self, record: _OpRecord) -> None:
        if self.expected is None:
            return
        i = len(self.ops)
        if i >= len(self.expected):
            self.difference = (
                f"op #{i} {record.op}: the call {self.then} ran {len(self.expected)} ops, the "
                f"call {self.now} more (a host branch taken another way){model_line()}"
            )
            return
        was = self.expected[i]
        if was.op != record.op:
            self.difference = (
                f"op #{i} is {record.op} {self.now}, {was.op} {self.then} (a host branch "
                f"taken another way){model_line()}"
            )
            return
        for k, (then, now) in enumerate(zip(was.args, record.args)):
            if then != now:
                self.difference = (
                    f"op #{i} {record.op}, argument {k}: {_describe(now)} {self.now}, "
                    f"{_describe(then)} {self.then}{model_line()}"
                )
                return

    def finish(self) -> None:
        """After a checking run: fewer ops than the capture is a difference too."""
        if self.expected is not None and self.difference is None:
            if len(self.ops) < len(self.expected):
                self.difference = (
                    f"the call {self.now} ran {len(self.ops)} ops, the call {self.then} "
                    f"{len(self.expected)} (a host branch taken another way)"
                )


def autograd_context() -> tuple[bool, bool]:
    """(grad mode, inference mode): what a composite op's decomposition may depend on."""
    return torch.is_grad_enabled(), torch.is_inference_mode_enabled()


def record(fn: Callable, args: tuple, kwargs: dict) -> tuple[Any, list[_OpRecord]]:
    """Run ``fn`` once, recording its host program: (its outputs, the program)."""
    with HostProgram() as program:
        out = fn(*args, **kwargs)
    return out, program.ops


def run_checked(fn: Callable, args: tuple, kwargs: dict, expected: list[_OpRecord]):
    """Run ``fn`` once against ``expected``: (its outputs, the first difference or None)."""
    with HostProgram(expected) as program:
        out = fn(*args, **kwargs)
    program.finish()
    return out, program.difference


def checked_once(fn: Callable, expected: list[_OpRecord], now: str, then: str):
    """``fn`` wrapped so that its first run, and only that, is checked against
    ``expected``: (the wrapped function, the check; read ``check.difference`` after
    ``check.finish()``). Capture wraps the body alone (a graph's own set-up, its generator
    state and pool, runs ops that are not the call's), once: a simulated replay re-runs
    the captured function and is checked by the backend itself."""
    check = HostProgram(expected, now=now, then=then)
    unchecked = [check]

    def once(*args, **kwargs):  # noqa: ANN002, ANN003
        if not unchecked:
            return fn(*args, **kwargs)
        with unchecked.pop():
            return fn(*args, **kwargs)

    return once, check


def _plain(x: Any) -> Any:
    """A comparable form of a non-tensor argument (floats by their repr: nan == nan)."""
    if isinstance(x, float):
        return repr(x)
    if isinstance(x, (int, bool, str, type(None))):
        return x
    if isinstance(x, torch.Generator):
        # which generator object serves a device is the runtime's (a lane swaps its own
        # in); a graph reads the device's seed and offset at replay either way
        return f"generator on {x.device}"
    return repr(x)


def _values_digest(t: torch.Tensor) -> str:
    # out of every mode: a recorder around this one (capture's check around the simulate
    # backend's own) must not see the digest's ops as the model's
    with _disable_current_modes():
        data = t.detach().contiguous().cpu()
        return hashlib.sha256(data.view(-1).view(torch.uint8).numpy().tobytes()).hexdigest()[:16]


def _describe(arg: tuple) -> str:
    kind = arg[0]
    if kind == "value":
        return repr(arg[1])
    if kind == "made":
        return f"the result of this call's op #{arg[1]}"
    if kind == "host data":
        return f"a {arg[3]} tensor {list(arg[2])} made from host data (values {arg[1]})"
    _, ptr, shape, stride, dtype = arg
    return f"a {dtype} tensor {list(shape)} stride {list(stride)} at 0x{ptr:x}"


def model_line() -> str:
    """ ", at file:line (code)" of the innermost frame of the model's code (outside torch
    and the runtime), or "" when there is none."""
    for frame in reversed(traceback.extract_stack()):
        if frame.filename.startswith((_RUNTIME_DIR, _TORCH_DIR)):
            continue
        return f", at {Path(frame.filename).name}:{frame.lineno} ({frame.line})"
    return ""
