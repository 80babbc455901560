"""Copy-on-write over an immutable shared region.

Contract of this layer: ``CopyOnWrite(base)`` lets any number of sessions read one
immutable region (e.g. a prompt cache primed once per process) and gives a session
its own private copy only when it first needs to write. The private copy is
allocated once and keeps its address; ``reset()`` copies the shared state back into
it in place (a turn boundary), never reallocating. The base is guarded by torch's
in-place version counter: if anyone writes it in place, the next ``read()`` or
``write()`` raises instead of serving silently corrupted shared state.
"""

from __future__ import annotations

import torch

from .regions import Region, RegionSpec


class CopyOnWrite:
    def __init__(self, base: Region) -> None:
        self.base = base
        self._base_version = base.tensor._version  # bumped by every in-place op
        self._private: Region | None = None
        self.copies = 0  # private copies made (first write + every reset)

    def _check_base(self) -> None:
        if self.base.tensor._version != self._base_version:
            raise RuntimeError(f"copy-on-write base {self.base.name} was written in place")

    @property
    def owns_copy(self) -> bool:
        return self._private is not None

    def read(self) -> torch.Tensor:
        """The current state: the private copy once written, else the shared base."""
        self._check_base()
        return (self._private or self.base).tensor

    def write(self) -> torch.Tensor:
        """A writable tensor: allocates and fills the private copy on first use."""
        self._check_base()
        if self._private is None:
            s = self.base.spec
            spec = RegionSpec(s.name + ".private", s.dtype, s.shape, s.axis, s.lifetime, "mutable")
            self._private = Region.allocate(spec, self.base.device)
            self._private.tensor.copy_(self.base.tensor)
            self.copies += 1
        return self._private.tensor

    def reset(self) -> None:
        """Back to the shared state, in place (the private address is kept)."""
        self._check_base()
        if self._private is not None:
            self._private.tensor.copy_(self.base.tensor)
            self.copies += 1
