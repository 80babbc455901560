"""Call signatures and the pure catalog dispatch.

Contract of this layer: ``signature_of(args, kwargs)`` turns a call into a
hashable key built only from ints, strs, bools and enum members. It never reads
tensor *data* and never synchronises the device: every field comes from tensor
metadata (shape, stride, dtype, device, requires_grad) or host objects.
``CatalogDispatch`` maps such a key to a captured class or to a ``Miss`` carrying
the reason. Both are pure, so admission clause (i) is unit-testable on CPU.

What a tensor contributes, and why:
  * shape, stride, dtype, device type and index — they fix the kernels a graph
    recorded; any change must miss.
  * requires_grad — eager autograd would record history that a replay cannot.
  * strides of dimensions of size 0 or 1 are keyed as 0: they address no second
    element, so they change neither the memory layout nor any kernel's choice
    (``is_contiguous`` ignores them), yet `clone()` of a slice keeps arbitrary ones.
  * ``data_ptr() % 16`` (alignment class), *not* ``storage_offset``: staged inputs
    are copied into the captured buffer, so the caller's offset never reaches the
    graph, and aliased inputs are pinned by their exact pointer in admission
    clause (ii). But vectorised kernels dispatch on pointer alignment, so an eager
    call on a misaligned view could take a different kernel than the one captured;
    keying the alignment class keeps that call out of the graph (fail closed).
Scalars contribute (type name, value); floats by ``float.hex`` so -0.0, 0.0 and NaN
are distinct, exact keys. Tuples, lists and dicts recurse (dict keys must be str
or int; they are sorted, as are kwargs, so keyword order does not matter). Any
other object makes the whole signature *unkeyable*: it always misses with reason
``unkeyable_argument`` rather than guessing at an identity.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Hashable, Iterable, Mapping

import torch

# Miss reasons (counter keys). Strings, so they read well in stats dicts.
SIGNATURE = "signature"
UNKEYABLE_ARGUMENT = "unkeyable_argument"
ALIASED_POINTER = "aliased_pointer"
WRITE_THROUGH_POINTER = "write_through_pointer"
INVALIDATED = "invalidated"
CAPTURE_FAILED = "capture_failed"
NOT_CAPTURED = "not_captured"
HOST_RNG = "host_rng"
EFFECT_MISMATCH = "effect_mismatch"
# a simulated replay met a host value other than its capture's (host_program.py): a real
# graph would have replayed the capture's value
STALE_HOST_VALUE = "stale_host_value"
NO_CUDA = "no_cuda"
DISABLED = "disabled"
GRAD_ENABLED = "grad_enabled"
COUNTER_BEFORE_START = "counter_before_start"
# a host value the body branches on is not the one the graphs were captured with
# (state/guards.py: `guard PATH == VALUE`)
HOST_GUARD = "host_guard"
# a staged counter's value breaks what the class's capture decided with it (a shape
# class it left, or a value a kernel baked): staging.py names the use
STAGED_GUARD = "staged_guard"
AMBIENT_STATE = "ambient_state"  # a torch setting differs from every capture (ambient.py)
# a session's parameter value has no graphs on the lane its step ran on yet: the step
# runs eager (exact) while the pool captures the value in the background (sessions.py)
VALUE_NOT_CAPTURED = "value_not_captured"


class Key(enum.Enum):
    UNKEYABLE = "unkeyable"


@dataclass(frozen=True)
class Miss:
    reason: str


def signature_and_leaves(
    args: tuple, kwargs: Mapping[str, Any]
) -> tuple[tuple, list[torch.Tensor]]:
    """The call's signature and its tensor leaves, in signature order.

    The leaves let replay stage inputs by position without walking the
    arguments twice."""
    leaves: list[torch.Tensor] = []
    bad: list[str] = []

    def enc(x: Any) -> Any:
        t = type(x)
        if t is torch.Tensor or isinstance(x, torch.Tensor):
            if x.layout is not _STRIDED:
                bad.append(f"tensor layout {x.layout}")
                return None
            dev = x.device
            leaves.append(x)
            shape = tuple(x.shape)
            return (
                "T",
                shape,
                _layout_stride(shape, x.stride()),
                _DTYPE_NAMES.get(x.dtype) or str(x.dtype),
                dev.type,
                -1 if dev.index is None else dev.index,
                x.requires_grad,
                x.data_ptr() % 16,
            )
        if x is None:
            return ("None",)
        if t is bool or t is int or t is str:
            return (t.__name__, x)
        if t is float:
            return ("float", x.hex())
        if isinstance(x, enum.Enum):
            return ("enum", t.__module__, t.__qualname__, x.name)
        if t is torch.dtype:
            return ("dtype", str(x))
        if t is torch.device:
            return ("device", x.type, -1 if x.index is None else x.index)
        if t is tuple or t is list:
            return (t.__name__, tuple(enc(i) for i in x))
        if t is dict:
            if all(type(k) is str for k in x):  # the common case: no sort key to build
                keys = sorted(x)
            elif all(type(k) in (str, int) for k in x):
                keys = sorted(x, key=lambda k: (type(k).__name__, k))
            else:
                bad.append("dict with non-str/int keys")
                return None
            return ("dict", tuple([(k, enc(x[k])) for k in keys]))
        bad.append(f"{t.__module__}.{t.__qualname__}")
        return None

    sig = (enc(tuple(args)), tuple((k, enc(kwargs[k])) for k in sorted(kwargs)))
    if bad:
        return (Key.UNKEYABLE, bad[0]), leaves
    return sig, leaves


def signature_of(args: tuple, kwargs: Mapping[str, Any]) -> tuple:
    return signature_and_leaves(args, kwargs)[0]


def is_unkeyable(sig: tuple) -> bool:
    return len(sig) > 0 and sig[0] is Key.UNKEYABLE


_ABSENT = object()


class CatalogDispatch:
    """signature → class key, or ``Miss(reason)``; dropped classes remember why."""

    def __init__(
        self,
        keys: Mapping[tuple, Hashable] | Iterable[tuple[tuple, Hashable]],
        dropped: Mapping[tuple, str] | None = None,
    ) -> None:
        items = keys.items() if isinstance(keys, Mapping) else keys
        self._keys: dict[tuple, Hashable] = {}
        for sig, key in items:
            if is_unkeyable(sig):
                raise ValueError(f"cannot enter an unkeyable signature in a catalog: {sig[1]}")
            if sig in self._keys:
                raise ValueError(f"duplicate signature for classes {self._keys[sig]!r} and {key!r}")
            self._keys[sig] = key
        # Known signatures that must miss with a specific reason (capture failed,
        # invalidated) rather than the generic "signature".
        self._dropped: dict[tuple, str] = {
            s: r for s, r in (dropped or {}).items() if s not in self._keys
        }

    def lookup(self, sig: tuple) -> Hashable | Miss:
        if is_unkeyable(sig):
            return Miss(UNKEYABLE_ARGUMENT)
        key = self._keys.get(sig, _ABSENT)
        if key is _ABSENT:
            return Miss(self._dropped.get(sig, SIGNATURE))
        return key

    def drop(self, sig: tuple, reason: str) -> None:
        """Remove a class; later lookups of its signature miss with ``reason``."""
        if self._keys.pop(sig, _ABSENT) is not _ABSENT:
            self._dropped[sig] = reason

    def __contains__(self, sig: tuple) -> bool:
        return sig in self._keys

    def __len__(self) -> int:
        return len(self._keys)

    def keys(self) -> list[tuple]:
        return list(self._keys)


_TENSOR_FIELDS = ("shape", "stride", "dtype", "device type", "device index", "requires_grad")


def _flat_leaves(sig: tuple) -> dict[str, tuple]:
    """``{path: leaf encoding}`` of a keyable signature, paths as the caller wrote them."""
    out: dict[str, tuple] = {}

    def walk(e: Any, path: str) -> None:
        tag = e[0] if isinstance(e, tuple) and e else None
        if tag in ("tuple", "list"):
            for i, x in enumerate(e[1]):
                walk(x, f"{path}[{i}]")
        elif tag == "dict":
            for k, x in e[1]:
                walk(x, f"{path}[{k!r}]")
        else:
            out[path] = e

    args, kwargs = sig
    for i, x in enumerate(args[1]):
        walk(x, f"args[{i}]")
    for k, x in kwargs:
        walk(x, k)
    return out


def _show_leaf(e: tuple) -> str:
    if e[0] == "T":
        return f"tensor{list(e[1])} stride {e[2]} {e[3].removeprefix('torch.')} on {e[4]}"
    if e[0] == "None":
        return "None"
    return f"{e[0]} {e[-1]!r}"


def _leaf_difference(path: str, was: tuple | None, now: tuple | None) -> str:
    if was is None:
        return f"{path}: not in the captured signature (live {_show_leaf(now)})"  # type: ignore[arg-type]
    if now is None:
        return f"{path}: missing from the call (captured {_show_leaf(was)})"
    if was[0] == now[0] == "T":
        for name, a, b in zip(_TENSOR_FIELDS, was[1:], now[1:]):
            if a != b:
                return f"{path}: {name} captured {a}, live {b}"
        return f"{path}: pointer alignment captured {was[-1]} (mod 16), live {now[-1]}"
    return f"{path}: captured {_show_leaf(was)}, live {_show_leaf(now)}"


def describe_mismatch(captured: Iterable[tuple], live: tuple) -> str:
    """Why ``live`` matched no captured signature: the first differing argument leaf of
    the nearest captured signature (fewest differing leaves), captured vs live."""
    if is_unkeyable(live):
        return f"unkeyable argument: {live[1]}"
    now = _flat_leaves(live)
    best: tuple[int, str] | None = None
    for sig in captured:
        was = _flat_leaves(sig)
        paths = list(dict.fromkeys([*was, *now]))
        diff = [p for p in paths if was.get(p) != now.get(p)]
        if diff and (best is None or len(diff) < best[0]):
            first = diff[0]
            best = (len(diff), _leaf_difference(first, was.get(first), now.get(first)))
    if best is None:
        return "no captured signature"
    n, text = best
    return text + (f" (and {n - 1} more)" if n > 1 else "")


def _layout_stride(shape: tuple[int, ...], stride: tuple[int, ...]) -> tuple[int, ...]:
    key = (shape, stride)
    keyed = _LAYOUT_STRIDES.get(key)
    if keyed is None:
        if len(_LAYOUT_STRIDES) >= _LAYOUT_MEMO:
            _LAYOUT_STRIDES.clear()
        keyed = _LAYOUT_STRIDES[key] = tuple([0 if n <= 1 else s for n, s in zip(shape, stride)])
    return keyed


# (shape, stride) -> the keyed stride: a call's leaves repeat the same few layouts, and a
# lookup costs a third of the comprehension (a replayed call keys 100+ cache tensors)
_LAYOUT_STRIDES: dict[tuple, tuple[int, ...]] = {}
_LAYOUT_MEMO = 4096


_STRIDED = torch.strided
# str(dtype) of every dtype torch names, looked up rather than formatted on each call
_DTYPE_NAMES = {d: str(d) for d in vars(torch).values() if isinstance(d, torch.dtype)}
