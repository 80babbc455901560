"""What capture must leave as it found it: the state a caller observes around a capture.

Contract of this layer. ``ExactShapeReplay.capture_all`` runs each class's probe,
warm-up and capture calls on live state; capture is transparent because
``CaptureSnapshot`` saves, once before the first class, host and device RNG state, the
contents of every region and write-through buffer, each region's host-side state and
every declared counter, and ``restore`` puts them back (after each class without the
buffer contents, which one restore at the end of the catalog copies back). Python-level
side effects of the callable itself cannot be rewound; contracts must not rely on them.

Contents are the costly part (a host copy of every region: 0.5-0.8 s for Token2Wav's
2 GB of carries and solver workspace, measured on the H200), so whoever knows better
says which to keep (``keep``): a lane's capture section saves them once for all its
engines (``RegionContents``, capture_section.CaptureSection), and a session pool's capture
between steps keeps none of the per-session or scratch regions, which hold no state
between steps (every step loads its session's state and takes it back).
"""

from __future__ import annotations

from typing import Any, Callable, Container, Mapping, Sequence

import torch

from .effects import host_rng_restore, host_rng_snapshot


class RegionContents:
    """Host copies of the contents of the regions (and write-through buffers) named in
    ``keep`` (None: all), put back by ``restore``."""

    def __init__(
        self,
        regions: Mapping[str, Any],
        write_through: Mapping[str, Callable[[], torch.Tensor]],
        keep: Container[str] | None = None,
    ) -> None:
        bufs = {f"region:{n}": r.tensor for n, r in regions.items() if keep is None or n in keep}
        bufs.update(
            {
                f"write_through:{n}": g()
                for n, g in write_through.items()
                if keep is None or n in keep
            }
        )
        # saved on the host: a device copy of every region would raise the process
        # peak by the whole contract state just to capture
        self.buffers = {k: (t, _host_copy(t)) for k, t in bufs.items()}

    def restore(self) -> None:
        for live, saved in self.buffers.values():
            live.copy_(saved)


class CaptureSnapshot:
    def __init__(
        self,
        regions: Mapping[str, Any],
        write_through: Mapping[str, Callable[[], torch.Tensor]],
        counters: Sequence[Any],
        backend: Any,
        device: torch.device,
        keep: Container[str] | None = None,
    ) -> None:
        """``keep``: the regions whose contents are saved (None: all; module docstring)."""
        self.regions, self.counters = regions, counters
        self.backend, self.device = backend, device
        self.host = host_rng_snapshot()
        self.device_rng = backend.device_rng_state(device)
        self.contents = RegionContents(regions, write_through, keep)
        self.python = {n: r._host_state() for n, r in regions.items()}
        self.counter_values = [c.value() for c in counters]

    def restore(self, buffers: bool = True) -> None:
        """Put back what was saved; ``buffers=False`` leaves region contents (a copy of
        every region from the host: seconds per catalog for Token2Wav's solver
        workspace) for the one restore at the end of ``capture_all``."""
        if buffers:
            self.contents.restore()
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
