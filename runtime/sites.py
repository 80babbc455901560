"""Binding sites: dotted paths into a model object and into call arguments/results.

A path is a tuple of steps, each `("attr", name)`, `("key", key)` or
`("index", i)`, exactly as a contract writes `flow.decoder.att_cache_buffer`,
`cache["estimator_att_cache"]` or `result[1]`. Generated adapters use these to
install regions and wrappers; nothing here knows any model.
"""

from __future__ import annotations

from typing import Any

Step = tuple[str, Any]


class SiteError(LookupError):
    """A declared binding site does not exist on the object given to bind()."""


def get_at(obj: Any, steps: tuple[Step, ...], *, what: str = "site") -> Any:
    cur = obj
    for i, (kind, value) in enumerate(steps):
        try:
            cur = getattr(cur, value) if kind == "attr" else cur[value]
        except (AttributeError, KeyError, IndexError, TypeError) as exc:
            raise SiteError(
                f"{what} {format_path(steps)}: cannot resolve step {format_path(steps[: i + 1])}"
            ) from exc
    return cur


def set_at(obj: Any, steps: tuple[Step, ...], value: Any, *, what: str = "site") -> None:
    """Assign in place at the last step (setattr or item assignment)."""
    if not steps:
        raise SiteError(f"{what}: an empty path cannot be assigned")
    parent = get_at(obj, steps[:-1], what=what)
    kind, key = steps[-1]
    if kind == "attr":
        setattr(parent, key, value)
    else:
        parent[key] = value


def replace_at(struct: Any, steps: tuple[Step, ...], value: Any) -> Any:
    """Return `struct` with the leaf at `steps` replaced; tuples are rebuilt, dicts and lists mutated."""
    if not steps:
        return value
    kind, key = steps[0]
    child = replace_at(struct[key], steps[1:], value)
    if isinstance(struct, tuple):
        items = list(struct)
        items[key] = child
        return type(struct)(items) if type(struct) is tuple else type(struct)(*items)
    struct[key] = child
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
        else:
            out += f"[{value}]"
    return out or "<root>"


def update_at(container: Any, steps: tuple[Step, ...], fn) -> bool:
    """Replace the leaf at `steps` (inside a mutable container) by `fn(leaf)`.

    Returns False, changing nothing, when the path is absent: the call then keeps
    its own convention and the replay's signature check decides what happens.
    """
    try:
        leaf = get_at(container, steps)
    except SiteError:
        return False
    set_at(container, steps, fn(leaf))
    return True


def require_sites(obj: Any, sites: dict[str, tuple[Step, ...]]) -> None:
    """Check every binding site before anything is changed, so a wrong object (or a
    contract written for another version) fails with one clear error and leaves the
    model untouched."""
    missing = [
        f"{name} at {format_path(steps)}"
        for name, steps in sites.items()
        if not has_site(obj, steps)
    ]
    if missing:
        raise SiteError(
            f"{type(obj).__name__} has no binding site for: "
            + "; ".join(missing)
            + " (nothing was changed)"
        )
