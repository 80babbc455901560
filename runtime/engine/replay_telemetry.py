"""An engine's accounting (replay.py): every miss counted by reason and explained, the
first of each reason and up to ``MISS_LOG_LIMIT`` in all kept with their detail, and
``stats()``, what ``binding.report()`` and the benchmarks read.

``ReplayTelemetry`` is a part of ``ExactShapeReplay``, reading the engine's state that
``ExactShapeReplay.__init__`` creates.
"""

from __future__ import annotations

from typing import Callable

import torch

from ..telemetry import LOGGER
from . import signature as R
from .ambient import describe_difference
from .classes import staging_bytes
from ..controls import ReplayMiss, strict_mode
from .replay_entry import EAGER_BY_DESIGN, MISS_LOG_LIMIT
from ..state.counters import shown_advances


class ReplayTelemetry:
    def _ambient_detail(self, group: list[int], live: tuple) -> str:
        keys = [self._entries[j].ambient_key for j in group]
        captured = [k for k in keys if k is not None]
        if not captured:
            return "no class of this signature recorded an ambient state"
        return describe_difference(self.device.type, captured[0], live)

    def _pointer_detail(self, group: list[int], leaves: list[torch.Tensor]) -> str:
        e = self._entries[group[0]]
        for i, ptr in e.aliased:
            if leaves[i].data_ptr() != ptr:
                return (
                    f"aliased argument leaf {i} is at 0x{leaves[i].data_ptr():x}; "
                    f"{len(group)} captured class(es) alias e.g. 0x{ptr:x} ({e.name})"
                )
        return "no captured class aliases these pointers"

    def _count_miss(self, reason: str, detail: Callable[[], str] | None) -> None:
        """Count, explain and log one miss; strict mode raises ``ReplayMiss`` for it."""
        self.misses[reason] += 1
        strict = reason != R.DISABLED and strict_mode()
        logged = len(self.miss_log) < MISS_LOG_LIMIT and reason not in EAGER_BY_DESIGN
        if self.misses[reason] == 1 or strict or logged:
            text = detail() if detail is not None else ""
            if logged:
                self.miss_log.append((self.calls, reason, text))
            if self.misses[reason] == 1:
                self.miss_details[reason] = text
                LOGGER.info(
                    "%s: first eager fallback for reason %s%s",
                    self.name,
                    reason,
                    f": {text}" if text else "",
                )
            if strict:
                raise ReplayMiss(self.name, reason, text)

    def stats(self) -> dict:
        cls = [
            {
                "name": e.name,
                "ambient": e.ambient.label,
                "status": e.status,
                "hits": e.hits,
                "warmup_s": e.warmup_s,
                "capture_s": e.capture_s,
                "allocated_bytes": e.allocated_bytes,
                "reserved_bytes": e.reserved_bytes,
                # variants of one class share its staging buffers
                "staging_bytes": staging_bytes(e.cls) if e.first_variant else 0,
                "detail": e.detail,
            }
            for e in self._entries
        ]

        def total(k: str) -> int | None:
            vals = [c[k] for c in cls if c[k] is not None]
            return sum(vals) if vals else None

        return {
            "kind": "replay",
            "name": self.name,
            "device": str(self.device),
            "backend": self.backend.name,
            "captured": self.captured,
            "effect": "unclassified" if self.effect is None else self.effect.value,
            "declared_effect": self.declared_effect.value,
            "rejected": self.rejected,
            "counters": {
                c.name: {"start": c.start, "advances": shown_advances(c.advances)}
                for c in self.counters
            },
            "hits": self.hits,
            "misses": dict(self.misses),
            "miss_details": dict(self.miss_details),
            "miss_log": [
                {"call": call, "reason": reason, "detail": detail}
                for call, reason, detail in self.miss_log
            ],
            "calls": self.calls,
            "ambient": [a.label for a in self.ambient],
            "host_constants": {
                "device_buffers": len(self.host_constants.cache),
                "served": self.host_constants.served,
                "istft_without_host_check": self.host_constants.istft_calls,
            },
            "eager_calls": sum(self.misses.values()),
            "invalidations": self.invalidations,
            "warmup_s": sum(c["warmup_s"] for c in cls),
            "capture_s": sum(c["capture_s"] for c in cls),
            "capture_allocated_bytes": total("allocated_bytes"),
            "capture_reserved_bytes": total("reserved_bytes"),
            # Reserve of replay (DESIGN eq. 6): staging of non-aliased inputs over
            # all classes + the frozen envelopes of write-through buffers.
            "staging_bytes": sum(c["staging_bytes"] for c in cls),
            "write_through_bytes": sum(
                g().untyped_storage().nbytes() for g in self.write_through.values()
            ),
            "classes": cls,
        }
