"""Staged counters: host ints a graph reads live from device buffers (issue 23, part 2).

Stock code often derives tensors from a host int it advances every call: transformers'
caches count tokens in ``cumulative_length`` and the model builds its rotary positions
with ``torch.arange(past, past + n)`` and its mask offsets with ``kv_arange += offset``.
A CUDA graph freezes those ints as kernel arguments, so a whole-step graph replays the
positions of its capture call. A counter declared ``staged`` is rewritten, while the
engine warms up and captures, so that what it feeds reaches the graph through memory:

* The counter's site holds a ``StagedInt`` during the call (staged_int.py): an int that
  remembers it is ``a * c + b`` of counter ``c``. Arithmetic with plain ints keeps the
  affine form (so ``past + n - past`` is a plain ``n`` again and shapes stay ints).
* A ``TorchFunctionMode`` sees every torch call that receives one. Two forms are
  rewritten, each bit for bit what the stock call computes: ``torch.arange(s, s + n)``
  becomes ``torch.arange(0, n) + buf`` and ``t + s`` / ``t += s`` / ``t - s`` becomes the
  same op with ``buf`` (a 0-dim tensor of ``t``'s dtype) for ``s``; integer and
  float32/float64 dtypes only, where both forms are exact. ``buf`` is one device scalar
  per use, made by the last warm-up call and read by the graph.
* Anything else a staged value reaches (a slice bound, a shape, a comparison, a branch,
  another torch op) is a *guard*: the value it had, or the outcome of the comparison,
  is recorded, and a replay whose live counters break a guard runs eager instead
  (``staged_guard``, naming the use). Comparisons that only pick a shape class (is the
  window full yet?) hold for the rest of the class, so they cost nothing; a value baked
  into a kernel fails closed.

Before each replay ``StagedUses.stage`` writes every use's live value into its buffer
(one tiny fill per use, on the replay's stream); eager calls never see any of this.
Model-agnostic: it knows torch's ``arange`` and ``add``/``sub``, never a model.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import _disable_current_modes

from .host_program import model_line as _where
from .staged_int import Affine, Guard, StagedInt

# dtypes where ``arange(0, n) + s`` and ``t + buf`` give the stock call's bits
_EXACT = frozenset({torch.int64, torch.int32, torch.float32, torch.float64})
_ADD = {
    torch.Tensor.__add__: (torch.add, False),
    torch.Tensor.__radd__: (torch.add, False),
    torch.Tensor.add: (torch.add, False),
    torch.add: (torch.add, False),
    torch.Tensor.__iadd__: (torch.Tensor.add_, True),
    torch.Tensor.add_: (torch.Tensor.add_, True),
    torch.Tensor.__sub__: (torch.sub, False),
    torch.Tensor.sub: (torch.sub, False),
    torch.sub: (torch.sub, False),
    torch.Tensor.__isub__: (torch.Tensor.sub_, True),
    torch.Tensor.sub_: (torch.Tensor.sub_, True),
}


class StagingError(RuntimeError):
    """A staged call did not repeat the uses of the call that made its buffers."""


class UnstagedUse(RuntimeError):
    """A declared counter that is not ``staged`` feeds a tensor: a graph would freeze
    its value (the message names the counter, the use and the model's line)."""


@dataclass
class Use:
    """One rewritten use: the device scalar the graph reads and what to write in it."""

    kind: str  # "arange" or the add/sub op
    value: Affine
    buf: torch.Tensor


@dataclass
class StagedUses:
    """One class's staged uses and guards (made by its last warm-up call)."""

    names: tuple[str, ...]
    staged: tuple[bool, ...]  # per counter: may its uses be rewritten (declared staged)
    uses: list[Use] = field(default_factory=list)
    guards: list[Guard] = field(default_factory=list)

    def broken_guard(self, values: Sequence[int]) -> Guard | None:
        for g in self.guards:
            if not g.holds(values):
                return g
        return None

    def stage(self, values: Sequence[int]) -> None:
        """Write every use's live value into its buffer (before a replay)."""
        for u in self.uses:
            u.buf.fill_(u.value.at(values))


class _StagedCall(TorchFunctionMode):
    """One staged call: makes the uses and guards (``making``) or repeats the recorded
    ones, reading the buffers already made (a capture, or a simulated replay)."""

    def __init__(self, uses: StagedUses, values: list[int], making: bool) -> None:
        super().__init__()
        self.uses, self.values, self.making = uses, values, making
        self.next = 0  # the use the next rewrite is (when repeating)
        # a staged value the body kept (in a list, on an object) is a plain int once the
        # call is over: what it decides later is the caller's, not the graph's
        self.running = True

    def guard(
        self, value: StagedInt, op: str, right: Any, where: str, outcome: bool = True
    ) -> None:
        if not (self.making and self.running):
            return  # the admission checks these before a replay runs
        r = right.form if isinstance(right, StagedInt) else right
        if type(r) is bool:
            r = int(r)
        self.uses.guards.append(Guard(value.form, op, r, outcome, where))

    def _use(self, kind: str, value: StagedInt, dtype: torch.dtype, device: Any) -> torch.Tensor:
        if not self.uses.staged[value.form.c]:
            name = self.uses.names[value.form.c]
            raise UnstagedUse(
                f"counter {name} feeds {kind} ({value.form.show(self.uses.names)} = "
                f"{int(value)}){_where()}: a graph would replay the capture's value; declare "
                f"it `counter {name} ... staged`"
            )
        if self.making:
            # made outside every dispatch mode: the buffer is the runtime's, not an op of
            # the model's call (host_program.py compares those between calls)
            with _disable_current_modes():
                buf = torch.full((), int(value), dtype=dtype, device=device)
            self.uses.uses.append(Use(kind, value.form, buf))
            return buf
        i, self.next = self.next, self.next + 1
        if i >= len(self.uses.uses):
            raise StagingError(f"staged use #{i} ({kind}) was not made by the warm-up call")
        u = self.uses.uses[i]
        if u.kind != kind or u.value != value.form or u.buf.dtype != dtype:
            raise StagingError(
                f"staged use #{i} is {kind} of {value.form.show(self.uses.names)}, the "
                f"warm-up made {u.kind} of {u.value.show(self.uses.names)}"
            )
        return u.buf

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        leaves = _leaves((args, kwargs))
        if not any(isinstance(x, StagedInt) for x in leaves):
            return func(*args, **kwargs)
        if func is torch.arange:
            out = self._arange(args, kwargs)
            if out is not None:
                return out
        if func in _ADD:
            out = self._add(func, args, kwargs)
            if out is not None:
                return out
        # any other use bakes the value: replay only where the counter has it again
        name = getattr(func, "__name__", str(func))
        for x in leaves:
            if isinstance(x, StagedInt):
                self.guard(x, "==", int(x), f"an argument of {name}")
        plain_args, plain_kwargs = _plain_ints((args, kwargs))
        return func(*plain_args, **plain_kwargs)

    def _arange(self, args: tuple, kwargs: dict) -> torch.Tensor | None:
        if len(args) not in (2, 3) or "out" in kwargs or "start" in kwargs:
            return None
        start, end = args[0], args[1]
        step = args[2] if len(args) == 3 else kwargs.get("step", 1)
        if not isinstance(start, StagedInt) or type(step) is not int:
            return None
        n = end - start  # a plain int where the length does not follow the counter
        if type(n) is not int:
            return None
        rest = {k: v for k, v in kwargs.items() if k != "step"}
        base = torch.arange(0, n, step, **rest)
        if base.dtype not in _EXACT:
            return None
        return base.add_(self._use("arange", start, base.dtype, base.device))

    def _add(self, func: Callable, args: tuple, kwargs: dict) -> torch.Tensor | None:
        if len(args) != 2 or kwargs:
            return None
        t, s = args
        if not isinstance(t, torch.Tensor) or not isinstance(s, StagedInt):
            return None
        if t.dtype not in _EXACT:
            return None
        op, in_place = _ADD[func]
        buf = self._use(op.__name__, s, t.dtype, t.device)
        return op(t, buf)


def _leaves(x: Any) -> list:
    """Every leaf of nested tuples, lists, dicts and slices (an index like
    ``t[:, past:]`` hides its ints in a slice, which pytree keeps whole)."""
    if isinstance(x, (tuple, list)):
        return [leaf for item in x for leaf in _leaves(item)]
    if isinstance(x, dict):
        return [leaf for item in x.values() for leaf in _leaves(item)]
    if isinstance(x, slice):
        return [x.start, x.stop, x.step]
    return [x]


def _plain_ints(x: Any) -> Any:
    """``x`` with every staged value a plain int (its guard already recorded)."""
    if isinstance(x, StagedInt):
        return int(x)
    if isinstance(x, (tuple, list)):
        return type(x)(_plain_ints(i) for i in x) if type(x) in (tuple, list) else x
    if isinstance(x, dict):
        return {k: _plain_ints(v) for k, v in x.items()}
    if isinstance(x, slice):
        return slice(_plain_ints(x.start), _plain_ints(x.stop), _plain_ints(x.step))
    return x


class Staging:
    """The declared counters of one engine: ``call`` runs a warm-up or capture call with
    them traced; a class's ``StagedUses`` admit and stage its replays. Every counter is
    traced, so what it decides is guarded; only a ``staged`` one may feed a tensor (one
    that is not raises ``UnstagedUse``: the capture refuses the callable)."""

    def __init__(self, counters: Sequence[Any]) -> None:
        self.counters = tuple(counters)
        self.names = tuple(c.name for c in self.counters)
        self.staged = tuple(bool(c.staged) for c in self.counters)

    def values(self) -> list[int]:
        return [c.value() for c in self.counters]

    def new_uses(self) -> StagedUses:
        return StagedUses(self.names, self.staged)

    @contextmanager
    def _staged_sites(self, call: _StagedCall) -> Iterator[None]:
        for i, c in enumerate(self.counters):
            c.write(StagedInt(call.values[i], Affine(i, 1, 0), call))
        try:
            yield
        finally:
            # what the body left at each site (it advances the counter) as a plain int
            for c in self.counters:
                c.write(int(c.read()))

    def call(self, fn: Callable, uses: StagedUses, making: bool) -> Callable:
        """``fn`` staged: the first kind (``making``) records ``uses`` anew."""

        def staged(*args: Any, **kwargs: Any) -> Any:
            if making:
                uses.uses.clear()
                uses.guards.clear()
            call = _StagedCall(uses, self.values(), making)
            try:
                with self._staged_sites(call), call:
                    return fn(*args, **kwargs)
            finally:
                call.running = False

        return staged
