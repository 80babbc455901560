"""What capture must leave as it found it: the state a caller observes around a capture.

Contract of this layer. ``ExactShapeReplay.capture_all`` runs each class's probe,
warm-up and capture calls on live state; capture is transparent because
``CaptureSnapshot`` saves, once before the first class, host and device RNG state, the
contents of every region and write-through buffer, each region's host-side state and
every declared counter, and ``restore`` puts them back (after each class without the
buffer contents, which one restore at the end of the catalog copies back). Python-level
side effects of the callable itself cannot be rewound; contracts must not rely on them.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import torch

from .effects import host_rng_restore, host_rng_snapshot


class CaptureSnapshot:
    def __init__(
        self,
        regions: Mapping[str, Any],
        write_through: Mapping[str, Callable[[], torch.Tensor]],
        counters: Sequence[Any],
        backend: Any,
        device: torch.device,
    ) -> None:
        self.regions, self.counters = regions, counters
        self.backend, self.device = backend, device
        bufs = {f"region:{n}": r.tensor for n, r in regions.items()}
        bufs.update({f"write_through:{n}": g() for n, g in write_through.items()})
        self.host = host_rng_snapshot()
        self.device_rng = backend.device_rng_state(device)
        # saved on the host: a device copy of every region would raise the process
        # peak by the whole contract state just to capture
        self.buffers = {k: (t, _host_copy(t)) for k, t in bufs.items()}
        self.python = {n: r._host_state() for n, r in regions.items()}
        self.counter_values = [c.value() for c in counters]

    def restore(self, buffers: bool = True) -> None:
        """Put back what was saved; ``buffers=False`` leaves region contents (a copy of
        every region from the host: seconds per catalog for Token2Wav's solver
        workspace) for the one restore at the end of ``capture_all``."""
        for live, saved in self.buffers.values() if buffers else ():
            live.copy_(saved)
        for n, st in self.python.items():
            self.regions[n]._set_host_state(st)
        for counter, value in zip(self.counters, self.counter_values):
            counter.write(value)
        host_rng_restore(self.host)
        self.backend.set_device_rng_state(self.device_rng, self.device)


def _host_copy(t: torch.Tensor) -> torch.Tensor:
    if t.device.type != "cuda":
        return t.clone()
    saved = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    saved.copy_(t)
    return saved
