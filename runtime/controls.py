"""Process-wide switches: disable replay, strict mode.

Contract of this layer: ``replay_enabled()`` and ``strict_mode()`` are read by the
engine at capture and on every call. An API setting wins over the environment;
``None`` hands control back to the environment:
  * ``DUPLEXCADENCE_DISABLE_REPLAY=1`` / ``set_replay_enabled(False)`` — nothing is
    captured and every call runs eager (counted as ``disabled``; never raises,
    since running eager is what was asked for).
  * ``DUPLEXCADENCE_STRICT=1`` / ``set_strict(True)`` / ``with strict():`` — any
    other miss raises ``ReplayMiss`` instead of falling back (for tests and CI).
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Iterator

DISABLE_ENV = "DUPLEXCADENCE_DISABLE_REPLAY"
STRICT_ENV = "DUPLEXCADENCE_STRICT"

_replay_override: bool | None = None
_strict_override: bool | None = None


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no", "off")


class ReplayMiss(RuntimeError):
    """Raised in strict mode when a call would have fallen back to eager."""

    def __init__(self, callable_name: str, reason: str, detail: str = "") -> None:
        self.callable_name = callable_name
        self.reason = reason
        msg = f"{callable_name}: replay miss ({reason})"
        super().__init__(msg + (f": {detail}" if detail else ""))


def replay_enabled() -> bool:
    if _replay_override is not None:
        return _replay_override
    return not _env_flag(DISABLE_ENV)


def set_replay_enabled(flag: bool | None) -> None:
    global _replay_override
    _replay_override = flag


def strict_mode() -> bool:
    if _strict_override is not None:
        return _strict_override
    return _env_flag(STRICT_ENV)


def set_strict(flag: bool | None) -> None:
    global _strict_override
    _strict_override = flag


@contextmanager
def strict(flag: bool = True) -> Iterator[None]:
    global _strict_override
    prev = _strict_override
    _strict_override = flag
    try:
        yield
    finally:
        _strict_override = prev


@contextmanager
def replay_switch(enabled: bool) -> Iterator[None]:
    global _replay_override
    prev = _replay_override
    _replay_override = enabled
    try:
        yield
    finally:
        _replay_override = prev
