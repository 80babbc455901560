"""The carry: retention by in-place writeback at one stable address.

Contract of this layer: ``CarryRegion.retain(history)`` leaves in the region
exactly the frames the declared retention keeps (see ``retention.py``) and returns
the region's own view at the retained extent. It never allocates on this path:
every step is a ``copy_`` between narrowed views, so the carry's ``data_ptr`` is
the same after every chunk and a captured graph can alias it with zero staging.

Stock code applies retention as ``torch.cat`` of slices, which materialises a new
tensor at a new address every chunk. Audit mode evaluates that stock rule beside
the writeback on every call and compares bit for bit; a divergence is logged with
the region, the call number and the first differing index, counted, and recorded
(the paper caught an append-order bug on chunk 3 this way). ``stock`` lets the
caller audit against the *released code's own* trim function instead of the
policy's reference, which is how a wrong retention declaration shows up.

Turn boundaries: ``snapshot()`` saves the immutable prompt state once (into a
second region allocated lazily, on first use) and ``restore()`` copies it back in
place — the carry never moves. ``adopt(t)`` hands a tensor produced outside the
contract (prompt priming) to the carry; it is a no-op when ``t`` already is the
carry's view, otherwise one counted copy.
"""

from __future__ import annotations

from typing import Callable

import torch

from ..audit import AuditRecord, bitwise_equal, first_difference
from .regions import Region, RegionSpec
from .retention import Retention
from ..telemetry import LOGGER

# stock(history, axis, prev, written) -> retained tensor, same signature as
# ``Retention.reference``.
StockRule = Callable[[torch.Tensor, int, "torch.Tensor | None", int], torch.Tensor]


class CarryRegion(Region):
    def __init__(
        self,
        spec: RegionSpec,
        retention: Retention,
        device: torch.device | str,
        audit: bool = False,
        stock: StockRule | None = None,
    ) -> None:
        if spec.axis is None:
            raise ValueError(f"carry {spec.name} needs a clock axis")
        if retention.capacity > spec.shape[spec.axis]:
            raise ValueError(
                f"carry {spec.name}: retention {retention} keeps {retention.capacity} frames "
                f"but the envelope holds {spec.shape[spec.axis]}"
            )
        super().__init__(spec, torch.zeros(spec.shape, dtype=spec.dtype, device=device))
        self.retention = retention
        self.audit = audit
        self.stock = stock
        self.length = 0  # live extent along the axis
        self.written = 0  # frames ever written (the ring's write position)
        self.retains = 0
        self.adoptions = 0
        self.restores = 0
        self.audit_checks = 0
        self.audit_divergences = 0
        self.audit_records: list[AuditRecord] = []
        self._saved: Region | None = None
        self._saved_state: tuple[int, int] | None = None

    @classmethod
    def allocate(  # type: ignore[override]
        cls, spec: RegionSpec, device: torch.device | str, retention: Retention, **kw
    ) -> "CarryRegion":
        return cls(spec, retention, device, **kw)

    # ------------------------------------------------------------------ checks
    def _check_history(self, history: torch.Tensor) -> None:
        spec = self.spec
        if history.dtype != spec.dtype:
            # copy_ would cast silently; a dtype change is a contract error.
            raise ValueError(f"carry {spec.name}: history dtype {history.dtype} != {spec.dtype}")
        if history.device != self.tensor.device:
            # A cross-device copy_ is a hidden sync on the hot path.
            raise ValueError(
                f"carry {spec.name}: history on {history.device}, carry on {self.device}"
            )
        if history.dim() != len(spec.shape) or any(
            history.shape[d] != spec.shape[d] for d in range(history.dim()) if d != spec.axis
        ):
            raise ValueError(
                f"carry {spec.name}: history shape {tuple(history.shape)} does not match "
                f"{spec.shape} off axis {spec.axis}"
            )

    def _is_own_view(self, t: torch.Tensor) -> bool:
        # torch reports data_ptr 0 for empty views, so an empty view of the
        # carry counts as its own view when it lives in the carry's storage.
        same_ptr = t.data_ptr() == self.data_ptr() or (t.numel() == 0 and self._shares_storage(t))
        return (
            same_ptr
            and t.stride() == self.tensor.stride()
            and t.dtype == self.spec.dtype
            and t.device == self.tensor.device
        )

    def _shares_storage(self, t: torch.Tensor) -> bool:
        return self.nbytes > 0 and t.untyped_storage().data_ptr() == self.storage_ptr()

    # --------------------------------------------------------------- hot path
    def current(self) -> torch.Tensor:
        """The live view (retained extent)."""
        return self.view(self.length)

    def retain(self, history: torch.Tensor) -> torch.Tensor:
        """Write back ``history`` under the retention; return the carry's live view."""
        self._check_history(history)
        axis = self.spec.axis
        pol = self.retention
        n = history.shape[axis]
        written = self.written if pol.appends else 0
        plan = pol.plan(n, written)
        if self._shares_storage(history):
            identity = all(s.dst == s.src for s in plan)
            if not (self._is_own_view(history) and identity and not pol.appends):
                raise ValueError(
                    f"carry {self.name}: history shares storage with the carry; an overlapping "
                    "copy is undefined (pass a tensor that does not alias the carry)"
                )
            # Exactly the carry's own view and nothing moves: a no-op.
            plan = ()
        expected = None
        if self.audit:
            # Audit path, not hot path: the stock rule may allocate and must see
            # the ring's contents before this writeback overwrites them.
            prev = self.tensor.narrow(axis, 0, pol.capacity).clone() if pol.appends else None
            rule = self.stock or pol.reference
            expected = rule(history, axis, prev, written)
        for seg in plan:
            self.tensor.narrow(axis, seg.dst, seg.length).copy_(
                history.narrow(axis, seg.src, seg.length)
            )
        self.length = pol.retained_length(n, written)
        if pol.appends:
            self.written += n
        self.retains += 1
        out = self.view(self.length)
        if expected is not None:
            self._compare(expected, out)
        return out

    def _compare(self, expected: torch.Tensor, out: torch.Tensor) -> None:
        self.audit_checks += 1
        if bitwise_equal(expected, out):
            return
        if expected.dtype != out.dtype:
            index = None
        else:
            index = first_difference(expected, out)
        rec = AuditRecord(
            region=self.name,
            call=self.retains,
            index=index,
            expected_shape=tuple(expected.shape),
            actual_shape=tuple(out.shape),
        )
        self.audit_divergences += 1
        self.audit_records.append(rec)
        LOGGER.warning(rec.describe())

    # ---------------------------------------------------------- turn boundary
    def adopt(self, t: torch.Tensor) -> torch.Tensor:
        """Make ``t`` the carry's content; no copy if it already is the carry's view."""
        t = self._leading_part(t)
        self._check_history(t)
        axis = self.spec.axis
        if self._is_own_view(t):
            e = t.shape[axis]
            if self.retention.appends and e != self.length:
                raise ValueError(
                    f"ring carry {self.name}: own view of {e} frames, live {self.length}"
                )
            if e > self.retention.capacity:
                raise ValueError(f"carry {self.name}: own view of {e} frames exceeds retention")
            self.length = e
            return t
        self.adoptions += 1
        if self.retention.appends:
            self.written = 0  # priming restarts the ring
        return self.retain(t)

    def _leading_part(self, t: torch.Tensor) -> torch.Tensor:
        """A stock tensor may be larger off the clock axis than the demand-sized carry
        (e.g. 16 solver steps reserved, 10 used): only the leading part is ever read,
        so adoption keeps that. Anything else is left for ``_check_history`` to reject."""
        spec = self.spec
        if t.dim() != len(spec.shape):
            return t
        off_axis = [d for d in range(t.dim()) if d != spec.axis]
        if any(t.shape[d] < spec.shape[d] for d in off_axis):
            return t
        for d in off_axis:
            if t.shape[d] > spec.shape[d]:
                t = t.narrow(d, 0, spec.shape[d])
        return t

    def _host_state(self) -> tuple:
        return (self.length, self.written)

    def _set_host_state(self, state: tuple) -> None:
        self.length, self.written = state

    def reset(self) -> None:
        super().reset()
        self.length = 0
        self.written = 0

    def snapshot(self) -> None:
        """Save the live state (e.g. the immutable prompt cache) for ``restore()``.

        The save region is allocated on the first snapshot and reused: one extra
        envelope for the carry's lifetime, never one per turn."""
        if self._saved is None:
            spec = RegionSpec(
                self.name + ".saved",
                self.spec.dtype,
                self.spec.shape,
                self.spec.axis,
                self.spec.lifetime,
                "immutable",
            )
            self._saved = Region.allocate(spec, self.device)
        self._saved.view(self.length).copy_(self.current())
        self._saved_state = (self.length, self.written)

    def restore(self) -> torch.Tensor:
        """Copy the saved state back in place (turn boundary); return the live view."""
        if self._saved is None or self._saved_state is None:
            raise RuntimeError(f"carry {self.name}: restore() before snapshot()")
        length, written = self._saved_state
        self.view(length).copy_(self._saved.view(length))
        self.length, self.written = length, written
        self.restores += 1
        return self.current()

    def stats(self) -> dict:
        s = super().stats()
        s.update(
            kind="carry",
            retention=repr(self.retention),
            length=self.length,
            retains=self.retains,
            adoptions=self.adoptions,
            restores=self.restores,
            audit=self.audit,
            audit_checks=self.audit_checks,
            audit_divergences=self.audit_divergences,
            saved_nbytes=0 if self._saved is None else self._saved.nbytes,
        )
        return s
