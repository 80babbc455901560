"""Control outputs: the integers a call returns that drive the host (``control`` in a
contract: a verifier's accepted count, a wake's retained count).

Contract of this layer: ``read_controls(callable, declared, result)`` returns each
declared control of one call's result as a host int, after checking that it is a
one-element tensor of the declared integer dtype within the declared range; anything
else raises ``ControlError`` naming the callable, the control and what was found. It
reads the value on the host (a device synchronisation): call it where the host needs
the value anyway, e.g. to move a committed end or to pick the next call's width.
"""

from __future__ import annotations

from typing import Any

import torch

from .sites import SiteError, format_path, get_at


class ControlError(ValueError):
    """A call's control output is not what its contract declares."""


def read_controls(callable_name: str, declared: Any, result: Any) -> dict[str, int]:
    """{control name: value} of ``result``, one call of ``callable_name`` whose
    ``CallableDecl.controls`` are ``declared``."""
    out = {}
    for c in declared:
        dot = "." if c.steps and c.steps[0][0] == "attr" else ""
        where = (
            f"callable {callable_name!r} control {c.name!r} at result{dot}{format_path(c.steps)}"
        )
        try:
            value = get_at(result, c.steps, what="result path")
        except SiteError as e:
            raise ControlError(f"{where}: the result has no such entry ({e})") from None
        if not isinstance(value, torch.Tensor) or value.numel() != 1:
            shown = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
            raise ControlError(f"{where}: expected a one-element tensor, got {shown}")
        if str(value.dtype).removeprefix("torch.") != c.dtype:
            raise ControlError(f"{where}: expected {c.dtype}, got {value.dtype}")
        got = int(value.item())
        if not c.low <= got <= c.high:
            raise ControlError(f"{where}: {got} is outside the declared {c.low}..{c.high}")
        out[c.name] = got
    return out
