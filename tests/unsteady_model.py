"""A streaming model that does NOT reproduce itself, for the reproduce tests.

``TinyStreamer`` (tiny_stream_model.py) with one planted nondeterminism: from chunk
``AT`` on, the *second* copy built in a process (or, with ``UNSTEADY_MARK`` naming a
file, every process after the first that sees the file) adds one ulp to element
``ELEMENT`` of layer 1's attention output — the kind of last-bit difference an
atomic reduction or a heuristically chosen kernel makes. ``state_only`` plants it
in a buffer no output reads instead.
"""

from __future__ import annotations

import os

import torch

import tiny_stream_model as T
from duplexcadence.runtime.tools.streams import StreamSpec

AT = 2
ELEMENT = (0, 1, 3)
_BUILT = [0]


class Nudge(torch.nn.Module):
    """Identity, except in an unsteady copy from chunk AT on."""

    def __init__(self, unsteady: bool) -> None:
        super().__init__()
        self.unsteady = unsteady
        self.calls = 0

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        # both copies run the same ops every chunk: only a value differs, as with a
        # kernel whose reduction order changes between runs
        self.calls += 1
        mask = torch.zeros_like(h, dtype=torch.bool)
        mask[ELEMENT] = self.unsteady and self.calls > AT
        return torch.where(mask, torch.nextafter(h, torch.full_like(h, float("inf"))), h)


class UnsteadyStreamer(T.TinyStreamer):
    def __init__(self, unsteady: bool, state_only: bool) -> None:
        super().__init__()
        self.nudge = Nudge(unsteady and not state_only)
        self.unsteady_state = unsteady and state_only
        self.register_buffer("scratch", torch.zeros(4))
        self.chunks_seen = 0

    def step(self, x, conv_cache, kv):  # noqa: ANN001
        h, conv, new_kv = super().step(x, conv_cache, kv)
        self.chunks_seen += 1
        self.scratch.add_(float(self.unsteady_state and self.chunks_seen > AT))  # read by nothing
        return self.nudge(h), conv, new_kv


def _unsteady() -> bool:
    mark = os.environ.get("UNSTEADY_MARK")
    if mark:  # across processes: the first to create the mark is steady (atomic create)
        try:
            os.close(os.open(mark, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return True
        return False
    _BUILT[0] += 1
    return _BUILT[0] % 2 == 0  # in one process: every second copy


def stream(state_only: bool = False) -> StreamSpec:
    def build() -> UnsteadyStreamer:
        return UnsteadyStreamer(_unsteady(), state_only)

    def drive(model: UnsteadyStreamer, chunks: int):
        for i in range(chunks):
            g = torch.Generator().manual_seed(1000 + i)
            yield model.push(torch.randn(1, T.CHANNELS, T.CHUNK, generator=g))

    return StreamSpec(build=build, drive=drive)


def state_stream() -> StreamSpec:
    return stream(state_only=True)
