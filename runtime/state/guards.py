"""HostGuard: a host value at a model site that picks the stock body's path.

Some stock callables branch on host state no argument shows: transformers'
``EncoderDecoderCache.is_updated[layer]`` is unset before a request's first decoder
call, which computes the cross-attention keys and values from the encoder output and
sets it; every later call reads them from the cache. A graph captured on one branch
replays that branch whatever the flag says, so the contract declares the value its
graphs are for (``guard past.is_updated[0] == true``) and the engine:
  * admission: a call while the site holds another value, or nothing, runs eager
    (miss reason ``host_guard``, naming the site and both values);
  * capture: warm-up and capture run with the site holding the value, and what the
    caller had there (or its absence) is put back afterwards (``CaptureSnapshot``).

It has the interface ``counters.at_start`` and ``capture_state.CaptureSnapshot`` use
for counters (``value``, ``write``, ``at_class``), so capture sets and restores both
the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

from .site_reads import SiteReads
from .sites import SiteError, Step, format_path, get_at, has_site, identity_key, set_at


class _Absent:
    """What a guard reads at a site that does not exist (yet): a dict key the stock
    body sets on its first call."""

    def __repr__(self) -> str:
        return "nothing"


ABSENT = _Absent()


@dataclass(frozen=True)
class HostGuard:
    name: str  # the dotted site, for reports and miss details
    read: Callable[[], Any]  # ABSENT when the site is not there
    write: Callable[[Any], None]  # ABSENT removes it
    expected: Any

    def value(self) -> Any:
        return self.read()

    def at_class(self, extents: Mapping[str, int] = {}) -> Any:
        """What every class is captured with."""
        return self.expected

    def holds(self) -> bool:
        v = self.read()
        # a bool is not the int 1: `True == 1` must not admit a call
        return type(v) is type(self.expected) and v == self.expected

    def mismatch(self) -> str:
        return f"{self.name} holds {self.read()!r}; the graphs are for {self.expected!r}"


def guard_at(model: Any, site: tuple[Step, ...], expected: Any) -> HostGuard:
    """The guard of ``site`` on ``model``: it reads ABSENT where the site is not (yet),
    and writing ABSENT removes the entry, as the caller had it before the body's first
    call set one. Every call reads it (admission), through one compiled ``SiteReads``."""
    reads = SiteReads(model, {"": site})

    def read() -> Any:
        try:
            return reads.read()[0]
        except SiteError:
            return ABSENT

    def write(value: Any) -> None:
        if value is not ABSENT:
            set_at(model, site, value)
        elif has_site(model, site):
            parent, (kind, key) = get_at(model, site[:-1]), site[-1]
            if kind == "attr":
                delattr(parent, key)
            else:
                del parent[identity_key(model, key) if kind == "identity" else key]

    return HostGuard(format_path(site), read, write, expected)
