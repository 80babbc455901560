"""Two copies of one stream driven in step: what verify and reproduce share.

Each copy draws from its own random-number streams (``RngStreams``: the global
generators' states saved and loaded around each of its steps, both starting from the
same state), the copies' items are taken pairwise (``next_pair``: a copy that ends
early or raises is a ``Divergence``, never an exception) and compared leaf by leaf
under the paths a user would write (``audit.named_leaves``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator

import torch


@dataclass(frozen=True)
class Divergence:
    chunk: int  # 0-based index of the chunk after which the copies differ
    kind: str  # "output" | "region" | "error" | "length" | "reference"
    name: str  # output path, region name, or what failed
    site: str | None = None  # a region's site on the model
    stock_shape: tuple[int, ...] | None = None
    bound_shape: tuple[int, ...] | None = None
    index: tuple[int, ...] | None = None  # first differing element
    box: tuple[tuple[int, int], ...] = ()  # per dim: first and last differing index
    count: int | None = None  # differing elements (same shapes only)
    stock_value: Any = None
    bound_value: Any = None
    note: str = ""

    def describe(self) -> str:
        where = f"{self.kind} {self.name}" + (f" (site {self.site})" if self.site else "")
        head = f"first divergence: {where} after chunk {self.chunk}"
        parts = [self.note] if self.note else []
        if self.stock_shape != self.bound_shape:
            parts.append(f"shape stock {self.stock_shape}, bound {self.bound_shape}")
        if self.index is not None:
            parts.append(
                f"first differing element {self.index}: stock {self.stock_value!r}, "
                f"bound {self.bound_value!r}"
            )
        if self.box:
            span = ", ".join(f"{lo}:{hi + 1}" for lo, hi in self.box)
            within = " of the extent both hold" if self.stock_shape != self.bound_shape else ""
            parts.append(f"{self.count} elements{within} differ, all within [{span}]")
        return head + "".join(f"\n  {p}" for p in parts)


class RngStreams:
    """One random-number stream per copy: the global generators' states are saved
    and loaded around each step of a copy, both starting from the state now."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda" and torch.cuda.is_available()
        start = self._get()
        self.states = {"stock": start, "bound": start}
        self.start = start

    def _get(self) -> tuple:
        return (torch.get_rng_state(), torch.cuda.get_rng_state_all() if self.cuda else None)

    def _set(self, state: tuple) -> None:
        torch.set_rng_state(state[0])
        if self.cuda:
            torch.cuda.set_rng_state_all(state[1])

    def wrap(self, copy: str, stream: Iterator[Any]) -> Iterator[Any]:
        def stepped() -> Iterator[Any]:
            while True:
                self._set(self.states[copy])
                try:
                    item = next(stream)
                except StopIteration:
                    return
                finally:
                    self.states[copy] = self._get()
                yield item

        return stepped()

    def restore(self) -> None:
        self._set(self.start)


END = object()


def next_pair(stock: Iterator[Any], bound: Iterator[Any], chunk: int) -> Any:
    expected = next(stock, END)
    if expected is END:
        return Divergence(chunk, "length", "stream", note="the stock stream ended early")
    try:
        actual = next(bound, END)
    except Exception as exc:  # the contract does not fit the model: a finding, named
        return Divergence(chunk, "error", type(exc).__name__, note=f"bound copy raised: {exc}")
    if actual is END:
        return Divergence(chunk, "length", "stream", note="the bound stream ended early")
    return expected, actual
