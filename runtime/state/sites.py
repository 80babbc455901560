"""Binding sites: a closed language of paths into a model object and call arguments/results.

A path is a tuple of steps, each `("attr", name)`, `("key", key)`,
`("index", i)` or `("identity", module_path)`, exactly as a contract writes
`flow.decoder.att_cache_buffer`, `cache["estimator_att_cache"]`, `result[1]` or
`states[id(vae.decoder.model[2])]`. Generated adapters use these to
install regions and wrappers; nothing here knows any model.

Contract of this layer: a path only ever reaches the object's *own* tree.
  * An attribute step never starts with `__` and resolves only to an attribute the
    object itself holds: an entry of its instance dict or a slot, a submodule,
    parameter or buffer of a `torch.nn.Module`; never a class attribute or a
    property. The one exception is the last step of a read, which may also be a
    method bound to that very object (`flow.inference_chunk`).
  * An item step indexes only a plain container (dict, list, tuple, torch's
    module containers). An identity step indexes only a dict, by `id()` of the
    `torch.nn.Module` its own path (attribute and index steps, from the same root,
    under these same rules) reaches: how vendor code keys per-layer state.
  * No step passes *through* a module, a class, a function or method, a builtin,
    a frame, code, generator or traceback, a descriptor, a mapping proxy or a
    tensor (a tensor is a leaf).
So a contract cannot reach a function's globals, the builtins, a class shared
with other objects, or a module's globals, and `set_at` writes only where the
path says, on the model's own objects. A violation is a `SiteError` naming the
site and the step, raised before anything is changed (`require_sites`).
"""

from __future__ import annotations

import difflib
import functools
import inspect
import re
import types
from typing import Any

import torch

Step = tuple[str, Any]


class SiteError(LookupError):
    """A declared binding site does not exist on the object given to bind(), or leaves
    the object's own tree (see the module docstring). `reason` says why, briefly."""

    def __init__(self, message: str, reason: str | None = None):
        super().__init__(message)
        self.reason = reason or message


_CONTAINERS = (
    dict,
    list,
    tuple,
    torch.nn.ModuleDict,
    torch.nn.ModuleList,
    torch.nn.Sequential,
    torch.nn.ParameterDict,
    torch.nn.ParameterList,
)
_OPAQUE = (types.MappingProxyType, functools.partial, property, staticmethod, classmethod)


# Exactly these types are none of the kinds `_opaque` refuses: answered without its
# dozen inspect calls (a call's arguments are walked by an aliased path on every call)
_PLAIN = frozenset({dict, list, tuple, types.SimpleNamespace})


def _opaque(obj: Any) -> str | None:
    """Why a path may not pass through `obj`, or None."""
    if type(obj) in _PLAIN:
        return None
    if isinstance(obj, torch.Tensor):
        return "a tensor"
    if inspect.ismodule(obj):
        return "a module"
    if inspect.isclass(obj):
        return "a class"
    if inspect.isroutine(obj) or isinstance(obj, (types.MethodType, types.MethodWrapperType)):
        return "a function or method"
    if inspect.isframe(obj) or inspect.iscode(obj) or inspect.istraceback(obj):
        return "an interpreter object"
    if inspect.isgenerator(obj) or inspect.iscoroutine(obj) or inspect.isasyncgen(obj):
        return "a generator or coroutine"
    if inspect.isdatadescriptor(obj) or inspect.ismethoddescriptor(obj) or isinstance(obj, _OPAQUE):
        return "a descriptor or proxy"
    return None


def _own_attribute(obj: Any, name: str) -> bool:
    """Whether `name` is held by `obj` itself (not its class)."""
    if isinstance(obj, torch.nn.Module):
        for table in ("_parameters", "_buffers", "_modules"):
            if name in obj.__dict__.get(table, {}):
                return True
    own = getattr(obj, "__dict__", None)
    if isinstance(own, dict) and name in own:
        return True
    return isinstance(inspect.getattr_static(type(obj), name, None), types.MemberDescriptorType)


def _enter(cur: Any, kind: str, value: Any) -> None:
    """Raise SiteError unless a step `kind`/`value` may be taken from (or assigned in) `cur`."""
    why = _opaque(cur)
    if why is not None:
        raise SiteError(f"it passes through {why} ({type(cur).__name__})")
    if kind == "attr":
        if not isinstance(value, str) or value.startswith("__"):
            raise SiteError(f"attribute {value!r} is not a site segment (no `__` names)")
    elif kind in ("key", "index"):
        if not isinstance(cur, _CONTAINERS):
            raise SiteError(f"{type(cur).__name__} is not a plain container (dict, list, tuple)")
    elif kind == "identity":
        if not isinstance(cur, dict):
            raise SiteError(f"{type(cur).__name__} is not a dict (an identity key indexes a dict)")
    else:
        raise SiteError(f"unknown step kind {kind!r}")


def identity_key(root: Any, module_path: Any) -> int:
    """`id()` of the module at `module_path` from `root` (attribute and index steps)."""
    if not isinstance(module_path, tuple) or any(
        not isinstance(s, tuple) or len(s) != 2 or s[0] not in ("attr", "index")
        for s in module_path
    ):
        raise SiteError("an identity key's path takes attribute and index steps only")
    module = _walk(root, module_path, what="identity key", last_read=False)
    if not isinstance(module, torch.nn.Module):
        raise SiteError(f"an identity key names a module, not {type(module).__name__}")
    return id(module)


def _step(cur: Any, kind: str, value: Any, *, last_read: bool, root: Any = None) -> Any:
    """Resolve one step from `cur`, or raise SiteError with the reason."""
    _enter(cur, kind, value)
    if kind == "identity":
        try:
            return cur[identity_key(root, value)]
        except KeyError as exc:
            raise SiteError(f"no entry for the module at {format_path(value)}") from exc
    if kind != "attr":
        try:
            return cur[value]
        except (KeyError, IndexError, TypeError) as exc:
            keys = cur.keys() if isinstance(cur, dict) else ()
            raise SiteError(f"no item {value!r}{_did_you_mean(value, keys)}") from exc
    if _own_attribute(cur, value):
        return getattr(cur, value)
    if last_read:  # a method bound to this very object: `flow.inference_chunk`
        bound = getattr(cur, value, None)
        if isinstance(bound, types.MethodType) and bound.__self__ is cur:
            return bound
    raise SiteError(
        f"{type(cur).__name__} holds no attribute {value!r} of its own"
        f"{_did_you_mean(value, _own_names(cur))} (class attributes and properties are not sites)"
    )


def _own_names(obj: Any) -> list[str]:
    """The attribute names a site step may take from `obj` (see `_own_attribute`)."""
    names = list(getattr(obj, "__dict__", {}) or {})
    if isinstance(obj, torch.nn.Module):
        for table in ("_parameters", "_buffers", "_modules"):
            names += list(obj.__dict__.get(table, {}))
    return [n for n in names if isinstance(n, str) and not n.startswith("__")]


def _did_you_mean(value: Any, candidates: Any) -> str:
    """' (did you mean 'x'?)' for the nearest existing name, so a misspelled site is
    refused with its fix; '' when nothing is close."""
    names = [c for c in candidates if isinstance(c, str)]
    close = difflib.get_close_matches(str(value), names, n=1) if names else []
    return f" (did you mean {close[0]!r}?)" if close else ""


def get_at(obj: Any, steps: tuple[Step, ...], *, what: str = "site") -> Any:
    """The value at `steps` (the last step may name a method bound to its object)."""
    return _walk(obj, steps, what=what, last_read=True)


def _walk(
    obj: Any, steps: tuple[Step, ...], *, what: str, last_read: bool, root: Any = None
) -> Any:
    cur = obj
    root = obj if root is None else root
    for i, (kind, value) in enumerate(steps):
        try:
            cur = _step(cur, kind, value, last_read=last_read and i == len(steps) - 1, root=root)
        except SiteError as exc:
            raise SiteError(
                f"{what} {format_path(steps)}: cannot resolve step "
                f"{format_path(steps[: i + 1])}: {exc.reason}",
                exc.reason,
            ) from None
    return cur


def set_at(obj: Any, steps: tuple[Step, ...], value: Any, *, what: str = "site") -> None:
    """Assign in place at the last step (setattr on the object itself, or item assignment)."""
    if not steps:
        raise SiteError(f"{what}: an empty path cannot be assigned")
    parent = _walk(obj, steps[:-1], what=what, last_read=False)
    kind, key = steps[-1]
    try:
        _enter(parent, kind, key)
        if kind == "identity":
            parent[identity_key(obj, key)] = value
        elif kind == "key" or kind == "index":
            if isinstance(parent, tuple):
                raise SiteError("a tuple cannot be assigned in place")
            parent[key] = value
        else:
            setattr(parent, key, value)
    except SiteError as exc:
        raise SiteError(f"{what} {format_path(steps)}: {exc.reason}", exc.reason) from None


def replace_at(struct: Any, steps: tuple[Step, ...], value: Any) -> Any:
    """Return `struct` with the leaf at `steps` replaced; tuples are rebuilt, dicts,
    lists and objects changed in place (every step follows the rules of `get_at`)."""
    if not steps:
        return value
    kind, key = steps[0]
    child = replace_at(_walk(struct, steps[:1], what="result", last_read=False), steps[1:], value)
    if isinstance(struct, tuple) and kind != "attr":
        items = list(struct)
        items[key] = child
        return type(struct)(items) if type(struct) is tuple else type(struct)(*items)
    set_at(struct, steps[:1], child, what="result")
    return struct


def has_site(obj: Any, steps: tuple[Step, ...]) -> bool:
    try:
        get_at(obj, steps)
    except SiteError:
        return False
    return True


def format_path(steps: tuple[Step, ...]) -> str:
    out = ""
    for kind, value in steps:
        if kind == "attr":
            out += ("." if out else "") + str(value)
        elif kind == "key":
            out += f'["{value}"]'
        elif kind == "identity":
            out += f"[id({format_path(value)})]"
        else:
            out += f"[{value}]"
    return out or "<root>"


# One step as `format_path` spells it: `name` first, `.name` after, `["key"]` (a key holds
# no `"`: the contract grammar's strings cannot), `[index]`, and `[id(` opening an identity
# key whose module path runs to its `)]`.
_PATH_STEP = re.compile(
    r'(?P<dot>\.)?(?P<attr>[A-Za-z_][A-Za-z0-9_]*)|\["(?P<key>[^"]*)"\]|\[(?P<index>[0-9]+)\]'
    r"|(?P<identity>\[id\()"
)


def parse_path(text: str) -> tuple[Step, ...]:
    """The steps of a dotted path, the inverse of `format_path`: generated code spells
    sites as `"flow.decoder.att_cache_buffer"`, `'stream_cache["estimator_att_cache"]'`,
    `"[1]"` or `"stream._states[id(vae.decoder.model[2])]"`. Anything else is a
    ValueError (nothing is evaluated)."""
    steps, pos = _parse_steps(text, 0, nested=False)
    return steps


def _parse_steps(text: str, pos: int, *, nested: bool) -> tuple[tuple[Step, ...], int]:
    """The steps from `pos` to the end of `text` (or, `nested`, to the `)]` closing an
    identity key), and the position after them."""
    steps: list[Step] = []
    start = pos
    while pos < len(text) and not (nested and text.startswith(")]", pos)):
        m = _PATH_STEP.match(text, pos)
        if m is None or (m["attr"] is not None and bool(m["dot"]) != bool(steps)):
            raise ValueError(f"not a site path: {text!r} (at character {pos})")
        if m["attr"] is not None:
            steps.append(("attr", m["attr"]))
        elif m["key"] is not None:
            steps.append(("key", m["key"]))
        elif m["index"] is not None:
            steps.append(("index", int(m["index"])))
        else:
            module, end = _parse_steps(text, m.end(), nested=True)
            if not text.startswith(")]", end):
                raise ValueError(f"not a site path: {text!r} (an unclosed [id( at {pos})")
            steps.append(("identity", module))
            pos = end + 2
            continue
        pos = m.end()
    if not steps:
        raise ValueError(f"not a site path: an empty path in {text!r} (at character {start})")
    return tuple(steps), pos


def update_at(container: Any, steps: tuple[Step, ...], fn) -> bool:
    """Replace the leaf at `steps` (inside a mutable container) by `fn(leaf)`.

    Returns False, changing nothing, when the path is absent: the call then keeps
    its own convention and the replay's signature check decides what happens.
    """
    parent = _plain_parent(container, steps)
    if parent is None:  # a step leaves plain containers: every rule checked (get_at)
        try:
            leaf = get_at(container, steps)
        except SiteError:
            return False
        set_at(container, steps, fn(leaf))
        return True
    key = steps[-1][1]
    try:
        leaf = parent[key]
    except (KeyError, IndexError, TypeError):
        return False
    value = fn(leaf)
    if value is not leaf:  # nothing to assign when the leaf stays (every replayed call)
        set_at(container, steps, value)
    return True


# the item steps of a call's arguments pass through these exact types only (a vendor's
# object is unpacked into a dict of its members first): a path through them breaks no
# rule of the module docstring, so it is taken by plain indexing, not step by step
_PLAIN_CONTAINERS = _PLAIN - {types.SimpleNamespace}


def _plain_parent(container: Any, steps: tuple[Step, ...]) -> Any:
    """The container holding the leaf at ``steps`` when every step is an item step into
    a dict, list or tuple; else None (``update_at`` then walks with ``get_at``)."""
    cur = container
    for i, (kind, value) in enumerate(steps):
        if kind not in ("key", "index") or type(cur) not in _PLAIN_CONTAINERS:
            return None
        if i == len(steps) - 1:
            return cur
        try:
            cur = cur[value]
        except (KeyError, IndexError, TypeError):
            return None
    return None


def require_sites(obj: Any, sites: dict[str, tuple[Step, ...]]) -> None:
    """Check every binding site before anything is changed, so a wrong object (or a
    contract written for another version, or a site that leaves the object's own
    tree) fails with one clear error and leaves the model untouched."""
    missing: dict[str, list[str]] = {}  # reason -> the sites that fail for it
    for name, steps in sites.items():
        try:
            get_at(obj, steps)
        except SiteError as exc:
            missing.setdefault(exc.reason, []).append(f"{name} at {format_path(steps)}")
    if missing:
        # sites that fail for one reason (a wrong root: all of them) are named a few at a
        # time: a contract of 130 cache tensors bound to the wrong object is one line
        parts = []
        for reason, where in missing.items():
            shown = "; ".join(where[:_SHOWN]) + (
                f" and {len(where) - _SHOWN} more" if len(where) > _SHOWN else ""
            )
            parts.append(f"{shown} ({reason})")
        raise SiteError(
            f"{type(obj).__name__} has no binding site for: "
            + "; ".join(parts)
            + " (nothing was changed)"
        )


_SHOWN = 3  # sites named per reason in require_sites' error
