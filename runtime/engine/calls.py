"""Call conventions: a caller's arguments put the way the contract declares them.

Contract of this layer. A contract names a callable's arguments as ``arg`` (by
position) or ``kwarg`` (by keyword); the catalog's signatures and the aliased
arguments' paths (``Aliased.container``) follow that declaration. Python lets a
caller pass any parameter either way, and the stock callable cannot tell the
difference, so ``CallConvention.normalise`` binds the caller's ``(args, kwargs)`` to
the stock callable's real signature (``inspect.signature``) and rebuilds them in the
declared form: the first ``positional`` parameters by position, every other passed
parameter by keyword. Both forms call the stock code with the same parameter
values; only the declared one has the signature the catalog keys and the paths the
carry's aliasing follows.

Where the signature cannot be read (a builtin), has ``*args``, or the call does not
bind to it, the call is left exactly as made: the stock code then raises its own
error, or admission misses with the argument named.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable

_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


class CallConvention:
    def __init__(self, fn: Callable, positional: int) -> None:
        self.positional = positional
        self.signature: inspect.Signature | None = None
        try:
            signature = inspect.signature(fn)
        except (TypeError, ValueError):
            return  # no readable signature: calls pass through unchanged
        params = list(signature.parameters.values())
        if any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params):
            return  # *args: positions beyond the named ones have no name to match
        if len(params) < positional or any(p.kind not in _POSITIONAL for p in params[:positional]):
            return  # the contract's positions are not all positional parameters
        if any(p.kind is inspect.Parameter.POSITIONAL_ONLY for p in params[positional:]):
            return  # a positional-only parameter cannot be passed by keyword
        self.signature = signature
        self._names = [p.name for p in params[:positional]]
        self._var_keyword = next(
            (p.name for p in params if p.kind is inspect.Parameter.VAR_KEYWORD), None
        )

    def normalise(self, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        """``(args, kwargs)`` in the declared form (see module docstring)."""
        if self.signature is None:
            return args, kwargs
        if len(args) == self.positional and all(n not in kwargs for n in self._names):
            return args, kwargs  # already declared form: the hot path does no binding
        try:
            bound = self.signature.bind(*args, **kwargs)
        except TypeError:
            return args, kwargs
        values = dict(bound.arguments)
        if any(n not in values for n in self._names):
            return args, kwargs  # a declared position left to its default: as made
        new_args = tuple(values.pop(n) for n in self._names)
        extra = values.pop(self._var_keyword, {}) if self._var_keyword else {}
        return new_args, {**values, **extra}


def convention_of(fn: Callable, classes: Any, aliased: Any) -> CallConvention | None:
    """The declared form of a callable's calls, or None where the contract declares no
    argument (a callable left eager with nothing aliased: its calls pass untouched).
    The positional count is the catalog's arity (the fewest, if classes differ), or,
    without a catalog, one past the last positional alias."""
    arities = {len(c.args) for c in classes}
    if arities:
        return CallConvention(fn, min(arities))
    if not aliased:
        return None
    indices = [a.steps[0][1] for a in aliased if a.container == "args" and a.steps]
    return CallConvention(fn, max(indices) + 1 if indices else 0)
