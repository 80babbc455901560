"""What `bind()` installed on a model: regions, carries, replays, constants.

Generated adapters fill one `Binding` and hand it back, so serving code can read
counters, print a report, or undo the binding. Model-agnostic.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from duplexcadence.runtime.determinism import restore_settings
from duplexcadence.runtime.sites import Step, format_path, set_at


@dataclass
class Binding:
    contract: str
    device: Any
    determinism: dict = field(default_factory=dict)
    regions: dict[str, Any] = field(default_factory=dict)
    replays: dict[str, Any] = field(default_factory=dict)
    eager: dict[str, str] = field(default_factory=dict)  # callable -> why it stays eager
    declared: dict[str, str] = field(default_factory=dict)  # region -> why nothing was allocated
    constants: dict[str, str] = field(default_factory=dict)  # host constant -> what was done
    _undo: list[tuple[Any, tuple[Step, ...], Any]] = field(default_factory=list, repr=False)

    def remember(self, obj: Any, steps: tuple[Step, ...], old: Any) -> None:
        self._undo.append((obj, steps, old))

    def unbind(self) -> None:
        """Put back the stock callables and constants bind() replaced, and the
        determinism settings bind() changed. Regions stay: the stock buffers they
        replaced were released, so rebuild a model to go back to stock."""
        while self._undo:
            obj, steps, old = self._undo.pop()
            set_at(obj, steps, old)
        previous = self.determinism.pop("previous", None)
        if previous:
            restore_settings(previous)

    def capture(self, *, progress: bool = True) -> "Binding":
        """Capture every replayed callable's catalog (before traffic).

        bind() does this itself unless told `capture=False`, which lets serving code
        bind first (so the state rule sizes every buffer before the prompt is primed)
        and capture once the model is on its device and primed."""
        for engine in self.replays.values():
            engine.capture_all(progress=progress)
        return self

    def stats(self) -> dict:
        return {
            "contract": self.contract,
            "device": str(self.device),
            "determinism": self.determinism,
            "callables": {name: r.stats() for name, r in self.replays.items()},
            "eager": dict(self.eager),
            "declared": dict(self.declared),
            "regions": {name: _region_stats(r) for name, r in self.regions.items()},
            "constants": dict(self.constants),
        }

    def report(self, width: int = 120) -> str:
        """Regions, replays (hits, misses by reason, capture cost) and constants as text."""
        from duplexcadence.runtime.telemetry import format_report

        lines = [f"duplexcadence binding of contract {self.contract} on {self.device}"]
        lines.append(format_report([*self.replays.values(), *self.regions.values()], width=width))
        for name, why in self.eager.items():
            lines.append(f"  callable {name}: eager ({why})")
        for name, what in self.constants.items():
            lines.append(f"  constant {name}: {what}")
        for name, why in self.declared.items():
            lines.append(f"  region {name}: {why}")
        return "\n".join(lines)


def _region_stats(region: Any) -> dict:
    t = region.tensor
    out = {
        "shape": tuple(t.shape),
        "dtype": str(t.dtype).replace("torch.", ""),
        "mib": t.numel() * t.element_size() / 2**20,
        "data_ptr": t.data_ptr(),
    }
    for counter in ("adoptions", "audit_divergences"):
        if hasattr(region, counter):
            out[counter] = getattr(region, counter)
    return out


def infer_device(model: Any):
    """The device of the first parameter or buffer found on `model` (or its attributes)."""
    import torch

    candidates = (
        [model] + [v for v in vars(model).values()] if hasattr(model, "__dict__") else [model]
    )
    for obj in candidates:
        if isinstance(obj, torch.nn.Module):
            for t in list(obj.parameters()) + list(obj.buffers()):
                return t.device
    return torch.device("cpu")


def install_region(binding: Binding, model: Any, steps, region: Any) -> None:
    """Put `region` at its binding site, keeping the stock state it replaces.

    The stock buffer may be larger (an implementation-constant envelope); the
    region keeps its leading part, which is all that any consumer reads.
    """
    import torch

    from duplexcadence.runtime.sites import get_at

    stock = get_at(model, steps)
    if isinstance(stock, torch.Tensor):
        leading = _leading_part(stock, tuple(region.tensor.shape))
        if leading is None:
            raise ValueError(
                f"region {region.name}: stock tensor {tuple(stock.shape)} at {format_path(steps)} "
                f"cannot hold the declared shape {tuple(region.tensor.shape)}"
            )
        with torch.no_grad():
            region.tensor.copy_(leading)
    # The stock buffer is not remembered for unbind(): holding it would keep the
    # implementation-constant envelope alive, the very memory the region saves.
    set_at(model, steps, region.tensor)


def adopt_prefix(region: Any, tensor: Any) -> Any:
    """An aliased fixed-shape region handed a stock tensor: copy its leading part in.

    Returns the region's own tensor, so the call reads the state at the region's
    address (a replay admits it) with the same values the stock tensor held.
    """
    import torch

    target = region.tensor
    if not isinstance(tensor, torch.Tensor):
        return tensor
    if tensor.data_ptr() == target.data_ptr() and tensor.shape == target.shape:
        return tensor
    leading = _leading_part(tensor, tuple(target.shape))
    if leading is None:
        return tensor  # not this region's state: leave it; admission decides
    with torch.no_grad():
        target.copy_(leading)
    return target


def _leading_part(stock: Any, shape: tuple[int, ...]) -> Any:
    """The leading `shape` block of a (possibly larger) stock tensor, or None if it
    cannot hold that shape. Only the leading part of a stock envelope is ever read."""
    if stock.dim() != len(shape) or any(s < t for s, t in zip(stock.shape, shape)):
        return None
    return stock[tuple(slice(0, n) for n in shape)]
