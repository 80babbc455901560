"""One catalog class of an engine under one declared ambient state: what its capture
recorded (the graph, its staging buffers and aliased pointers, seconds and bytes), and
the small constants the engine's parts share."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from . import signature as R
from .ambient import AUTOCAST_OFF, Autocast
from .classes import CaptureClass
from .outputs import OutputPlan


@dataclass
class Entry:
    index: int
    cls: CaptureClass
    ambient: Autocast = AUTOCAST_OFF  # the declared autocast state it is captured under
    first_variant: bool = True  # variants of one class share its staging buffers
    status: str = "pending"  # pending | captured | failed | invalidated | rejected
    sig: tuple | None = None
    captured: Any = None
    plan: OutputPlan | None = None
    inputs: tuple = ()  # (args, kwargs) kept alive: the graph reads these buffers
    staged: list[tuple[int, torch.Tensor]] = field(default_factory=list)
    aliased: list[tuple[int, int]] = field(default_factory=list)
    ambient_key: tuple | None = None  # ambient.ambient_state() as captured
    hits: int = 0
    warmup_s: float = 0.0
    capture_s: float = 0.0
    allocated_bytes: int | None = None
    reserved_bytes: int | None = None
    detail: str = ""
    name: str = ""  # the class name, with its autocast state when several are declared
    stage_uses: Any = None  # staging.StagedUses: staged counters' buffers and guards
    capture_fn: Any = None  # what the capture runs: the callable, staged if declared
    # what a replay advances each declared host counter by (state/counters.py): resolved
    # from the class once, not on every replay
    counter_amounts: tuple[int, ...] = ()


# Misses kept with their detail per engine (binding.report() lists them); later ones
# are counted only. Reasons that are no contract problem are never listed.
MISS_LOG_LIMIT = 100
EAGER_BY_DESIGN = frozenset({R.NO_CUDA, R.DISABLED})


def buffer_key(t: torch.Tensor) -> tuple:
    # t.shape is a torch.Size, a tuple: compared as one, never converted on a call
    return (t.data_ptr(), t.shape, t.stride(), t.dtype)
