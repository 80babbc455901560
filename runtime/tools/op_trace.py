"""What one stock copy did, op by op: the trace ``clockc reproduce`` compares.

Contract of this layer. ``OpTrace`` (a ``TorchDispatchMode``) records every aten op a
model runs with the module it ran in (forward pre/post hooks keep the path): the op's
data outputs kept as clones within a byte budget and always fingerprinted
(``fingerprint``: two int64 sums of the bits, on the device). ``state_tensors`` lists a
model's stream state (module attributes that are not parameters: caches, rings,
offsets), ``weight_prints`` its weights' fingerprints. What differs between two copies
is reproduce.py's; this module only records. A diagnostic, never on the serving path.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ..audit import _as_bits
from ..engine.module_scope import named_modules

# Per copy and chunk, op outputs kept as device clones up to this many bytes; past it
# only fingerprints (a difference is still found, without its values).
DEFAULT_KEEP_BYTES = 1 << 30
# A larger op output (a whole cache written in place) is only fingerprinted.
KEEP_TENSOR_BYTES = 16 << 20
_STATE_DEPTH = 4  # how far the state walk follows plain objects from a module

# Op outputs that are not data and are never read as such, so their bytes may differ
# between copies without meaning anything: the allocation ops' fresh memory, and the
# random-number bookkeeping attention kernels return (seed, offset, sequence lengths,
# debug mask; left uninitialised without dropout). Measured on the H200: the philox
# seeds of the mem-efficient and cuDNN kernels differed between two Moshi copies on
# their first calls while every attention result agreed. An uninitialised buffer that
# IS read shows at its reader.
UNINITIALISED_OPS = frozenset(
    {"aten.empty", "aten.empty_like", "aten.empty_strided", "aten.new_empty",
     "aten.new_empty_strided"}
)  # fmt: skip
# the attention kernels' data: the result and its log-sum-exp (their first two tensor
# outputs; what follows varies by torch version and is bookkeeping)
DATA_OUTPUTS = {
    "aten._scaled_dot_product_efficient_attention": 1,
    "aten._efficient_attention_forward": 1,
    "aten._scaled_dot_product_flash_attention": 1,
    "aten._scaled_dot_product_cudnn_attention": 1,
    "aten._flash_attention_forward": 1,
}


def state_tensors(model: Any) -> dict[str, torch.Tensor]:
    """Every tensor a module keeps outside its parameters and buffers' names, i.e. its
    stream state (``module._streaming_state.kv_cache.cache``, a dict of caches), by
    path; buffers too (a stock loop may write one in place). Parameters are weights."""
    out: dict[str, torch.Tensor] = {}
    seen: set[int] = set()

    def walk(x: Any, path: str, depth: int) -> None:
        if isinstance(x, torch.Tensor):
            if id(x) not in seen:
                seen.add(id(x))
                out[path] = x
            return
        if depth > _STATE_DEPTH or id(x) in seen or isinstance(x, torch.nn.Module):
            return
        if isinstance(x, (str, bytes, int, float, bool, type(None))):
            return
        seen.add(id(x))
        if isinstance(x, dict):
            for k, v in x.items():
                walk(v, f"{path}[{k!r}]", depth + 1)
        elif isinstance(x, (list, tuple)):
            for i, v in enumerate(x):
                walk(v, f"{path}[{i}]", depth + 1)
        elif dataclasses.is_dataclass(x):
            for f in dataclasses.fields(x):
                walk(getattr(x, f.name, None), f"{path}.{f.name}", depth + 1)
        elif hasattr(x, "__dict__") and not callable(x):
            for k, v in vars(x).items():
                walk(v, f"{path}.{k}", depth + 1)

    for path, m in named_modules(model):
        for name, buf in m.named_buffers(recurse=False):
            walk(buf, f"{path}.{name}" if path else name, 0)
        for k, v in vars(m).items():
            if k in ("_parameters", "_buffers", "_modules") or k.startswith("__"):
                continue
            if k.startswith("_") and "state" not in k and "cache" not in k:
                continue  # private machinery (hooks, flags), not stream state
            walk(v, f"{path}.{k}" if path else k, 0)
    return out


def weight_prints(model: Any) -> dict[str, list[int]]:
    """Every parameter's fingerprint by path: two copies built from one seed must start
    from the same weights (a loader that leaves a tensor uninitialised would not)."""
    out = {}
    for path, m in named_modules(model):
        for name, p in m.named_parameters(recurse=False):
            out[f"{path}.{name}" if path else name] = fingerprint(p).tolist()
    return out


def _leaves(x: Any) -> list[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for v in x for t in _leaves(v)]
    if isinstance(x, dict):
        return [t for v in x.values() for t in _leaves(v)]
    return []


_WEIGHTS: dict[torch.device, torch.Tensor] = {}


def fingerprint(t: torch.Tensor) -> torch.Tensor:
    """Two int64 sums of ``t``'s bit patterns (plain and position-weighted), on its
    device: equal tensors always agree; different ones practically never do."""
    bits = _as_bits(t.detach())
    if bits.dtype == torch.bool:
        bits = bits.to(torch.uint8)
    flat = bits.reshape(-1).to(torch.int64)
    n = flat.numel()
    w = _WEIGHTS.get(t.device)
    if w is None or w.numel() < n:
        w = torch.arange(1, max(n, 1024) + 1, device=t.device, dtype=torch.int64)
        _WEIGHTS[t.device] = w
    return torch.stack([flat.sum(), (flat * w[:n]).sum()])


@dataclass
class _Op:
    module: str
    op: str
    shapes: tuple
    kept: list[torch.Tensor | None]  # clones (within the byte budget) or None
    prints: list[torch.Tensor]  # fingerprints, on the device
    outputs: list[int] = field(default_factory=list)  # which of the op's outputs each is


class OpTrace(TorchDispatchMode):
    """Records every op's outputs (module path, op name, clones within a budget and
    fingerprints) while active; ``modules`` hooks keep the current module path."""

    def __init__(self, model: Any, keep_bytes: int = DEFAULT_KEEP_BYTES) -> None:
        super().__init__()
        self.keep_bytes = keep_bytes
        self.ops: list[_Op] = []
        self._kept = 0
        self._stack: list[str] = []
        self._handles = []
        for path, m in named_modules(model):
            self._handles.append(m.register_forward_pre_hook(self._enter(path)))
            self._handles.append(m.register_forward_hook(self._leave))
        self.active = True

    def _enter(self, path: str):
        def hook(*_: Any) -> None:
            self._stack.append(path)

        return hook

    def _leave(self, *_: Any) -> None:
        if self._stack:
            self._stack.pop()

    def new_chunk(self) -> None:
        self.ops, self._kept = [], 0

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        out = func(*args, **(kwargs or {}))
        if not self.active:
            return out
        packet = str(func.overloadpacket)
        if packet in UNINITIALISED_OPS:
            return out
        numbered = list(enumerate(_leaves(out)))[: DATA_OUTPUTS.get(packet)]
        leaves = [t for _, t in numbered]
        kept: list[torch.Tensor | None] = []
        prints = []
        for t in leaves:
            nbytes = t.numel() * t.element_size()
            if nbytes <= KEEP_TENSOR_BYTES and self._kept + nbytes <= self.keep_bytes:
                kept.append(t.detach().clone())
                self._kept += nbytes
            else:
                kept.append(None)
            prints.append(fingerprint(t))
        shapes = tuple((tuple(t.shape), str(t.dtype).removeprefix("torch.")) for t in leaves)
        if isinstance(out, (int, float, bool)):  # a host value (.item()): compared as is
            shapes += (("value", out),)
        self.ops.append(
            _Op(self._stack[-1] if self._stack else "", str(func), shapes, kept, prints)
        )
        return out


def _host_prints(ops: list[_Op]) -> list[list[int]]:
    """Every fingerprint of ``ops`` in order, on the host: one transfer per device (an
    op may run on the host in a device model: an index built with torch.arange)."""
    flat = [p for op in ops for p in op.prints]
    out: list[list[int] | None] = [None] * len(flat)
    by_device: dict[torch.device, list[int]] = {}
    for i, p in enumerate(flat):
        by_device.setdefault(p.device, []).append(i)
    for idx in by_device.values():
        for i, v in zip(idx, torch.stack([flat[i] for i in idx]).cpu().tolist()):
            out[i] = v
    return out  # type: ignore[return-value]


def _state_prints(model: Any) -> dict[str, list[int]]:
    """Every state tensor's fingerprint by path (a 7B model's rings are GBs: hashed on
    the device, one transfer)."""
    state = state_tensors(model)
    ops = [_Op("", "", (), [], [fingerprint(t) for t in state.values()])]
    return dict(zip(state, _host_prints(ops)))
