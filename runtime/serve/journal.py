"""A session's calls as its client made them, for rebuilding the session elsewhere.

Contract of this layer (ray-free; client.py keeps one per session when restoring is on):
a served session's outputs are a function of its params and the calls it got — each
session's bytes equal its solo stock run, whatever else runs beside it — so a session
whose replica died can be rebuilt on another replica by opening it with the same params
and making the same calls again. ``Journal`` keeps those calls in order (each payload
pickled when the call is made, so a caller that reuses its buffer changes nothing) and
a SHA-256 of every output the client already returned. ``replay`` must reproduce each
of those outputs byte for byte, or it fails (``RestoreDiverged``) and the session is
lost as it would have been without a journal: a restore never hands back other bytes.
The ingress (app.py) replays it; a SessionClient sends it the journal it kept.

A journal holds at most ``limit`` calls: the call after that drops it (``why_not``
then says so), since a session that old would take longer to replay than a client
waits. Its memory is the pickled payloads (``nbytes``).
"""

from __future__ import annotations

import hashlib
import pickle
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable, Iterator

import numpy as np


class RestoreDiverged(RuntimeError):
    """A replayed call answered other bytes than the session's client got the first time."""


def output_digest(output: Any) -> str:
    """SHA-256 of an output's bytes: an array's dtype, shape and data; anything else
    (a tensor numpy cannot hold, a dict) as its pickle."""
    h = hashlib.sha256()
    if isinstance(output, np.ndarray):
        h.update(f"{output.dtype.str}{output.shape}".encode())
        h.update(np.ascontiguousarray(output).tobytes())
    else:
        h.update(pickle.dumps(output, protocol=5))
    return h.hexdigest()


@dataclass(frozen=True)
class Call:
    method: str  # "step" or "reset"
    payload: bytes | None  # the step's payload, pickled when it was sent
    digest: str | None  # output_digest of what the step answered


@dataclass
class Journal:
    params: dict
    limit: int
    calls: list[Call] = field(default_factory=list)
    dropped_after: int | None = None  # how many calls the session had when this dropped

    @staticmethod
    def freeze(payload: Any) -> bytes:
        """The payload as it is now (call before sending it)."""
        return pickle.dumps(payload, protocol=5)

    def record(self, method: str, frozen: bytes | None, output: Any = None) -> None:
        """A call that succeeded, in the order the session got them."""
        if self.dropped_after is not None:
            self.dropped_after += 1
            return
        if len(self.calls) >= self.limit:
            self.dropped_after = len(self.calls) + 1
            self.calls.clear()
            return
        digest = output_digest(output) if method == "step" else None
        self.calls.append(Call(method, frozen if method == "step" else None, digest))

    def why_not(self) -> str | None:
        """Why this session cannot be restored, or None."""
        if self.dropped_after is None:
            return None
        return (
            f"it had made {self.dropped_after} calls, more than the {self.limit} a "
            f"restore replays"
        )

    @property
    def nbytes(self) -> int:
        return sum(len(c.payload or b"") for c in self.calls)

    def replaying(self) -> Iterator[tuple[str, tuple, Callable[[Any], None]]]:
        """Every recorded call in order, as ``(method, args, check)``: make the call on
        the fresh session and pass its output to ``check``, which raises
        ``RestoreDiverged`` if it differs from what the client got the first time."""
        for i, c in enumerate(self.calls):
            if c.method == "reset":
                yield "reset", (), _nothing_to_check
            else:
                yield "step", (pickle.loads(c.payload),), partial(self._check, i)

    def _check(self, i: int, output: Any) -> None:
        digest = output_digest(output)
        if digest != self.calls[i].digest:
            raise RestoreDiverged(
                f"call {i + 1} of {len(self.calls)} answered other bytes on replay "
                f"(sha256 {digest[:12]}, first time {self.calls[i].digest[:12]})"
            )


def _nothing_to_check(output: Any) -> None:
    pass


__all__ = ["Call", "Journal", "RestoreDiverged", "output_digest"]
