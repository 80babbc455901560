"""Cells and the worker ``Run`` shared by the one-callable streaming decoders (issue 15):
VoxCPM2's AudioVAE (``bench/voxcpm2.py``) and Qwen3-Omni Code2Wav
(``bench/qwen3_code2wav.py``), and by transformers' Mimi encoder and decoder
(``bench/transformers_mimi.py``: the encoder's step yields codes, not PCM).

Each driver declares a ``Decoder``: how to build the released model (seeded random
weights), how to open its stock stream (``step()`` -> one chunk's float32 PCM, the
vendor's own loop body), how to bind the generated adapter to it, and which module's
method a ``torch.compile`` control wraps. The cells, the same for both:

* ``stock``      the vendor loop, eager. The reference.
* ``adapter``    the generated adapter bound (and captured) before the first chunk. The
  worker records the catalog ``clockc`` predicted and the classes the run met
  (``catalog_predicted`` / ``signatures_observed``; misses are listed as ``miss:reason``).
* ``compile``    control: ``torch.compile(mode="default")`` of the decoder module's method.
* ``compile_ro`` control: ``torch.compile(mode="reduce-overhead")`` (inductor's CUDA graphs);
  it aborted in torch 2.11 for Token2Wav, so anything it raises is a ``failed`` record.
* ``compile_mat`` control: ``torch.compile(mode="max-autotune-no-cudagraphs")``.

The compile modes are Token2Wav's (``bench.token2wav.COMPILE_CELLS``: one definition).

A driver may add its own cells (a competitor) through ``Decoder.extra_setup``.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from bench.harness import Cell, CellFailed, WorkerContext
from bench.token2wav import COMPILE_CELLS, arm_compile_budget, counters_delta, dynamo_counters

# {Token2Wav compile cell: its torch.compile mode}
COMPILE_MODES = {c.name: c.compile_mode for c in COMPILE_CELLS}


@dataclass(frozen=True)
class DecoderCell(Cell):
    bind: bool = False
    compile_mode: str | None = None


def cells(compiled: str, extra: tuple[Cell, ...] = ()) -> tuple[Cell, ...]:
    """The shared cells; ``compiled`` names what the compile controls wrap."""
    return (
        DecoderCell("stock", "the vendor's streaming loop, eager (the reference)"),
        DecoderCell(
            "adapter",
            "the generated adapter (CUDA graphs) bound on the fresh stream, captured before "
            "the first chunk",
            bind=True,
        ),
        compile_cell("compile", COMPILE_MODES["compile_default"], compiled),
        compile_cell("compile_ro", COMPILE_MODES["compile_ro"], compiled),
        compile_cell("compile_mat", COMPILE_MODES["compile_mat"], compiled),
        *extra,
    )


def compile_cell(name: str, mode: str, compiled: str) -> DecoderCell:
    """A torch.compile control of ``compiled`` in ``mode``; what it raises is ``failed``."""
    return DecoderCell(
        name,
        f'control: torch.compile(mode="{mode}", dynamic=False) of {compiled}',
        needs_cuda=True,
        failure=f"torch.compile / {mode}",
        compile_mode=mode,
    )


@dataclass(frozen=True)
class Decoder:
    """What a driver says about its model (see the module docstring).

    ``open(model, args, n_steps)`` returns the stream (``.step()`` -> PCM); ``bind(stream,
    device, backend=None)`` the uncaptured Binding (``backend``: a graph backend, as
    ``bench/host_path.py`` passes one); ``compile_site(stream)`` the (object, attribute) whose
    method the compile controls replace; ``extra_setup(cell, stream, info)`` sets up the
    driver's own cells."""

    workload: str  # bench.workloads.<workload>
    adapter: str  # duplexcadence.generated.<adapter>
    build: Callable[[Any, Any], Any]  # (args, device) -> model
    open: Callable[[Any, Any, int], Any]
    bind: Callable[..., Any]  # (stream, device, backend=None) -> Binding
    compile_site: Callable[[Any], tuple[Any, str]]
    extra_setup: Callable[[Cell, Any, dict], None] | None = None
    output: str = "pcm"  # the Stream a step yields (an encoder's: "codes")


class DecoderRun:
    """One (block, cell): the model built, its stream opened, the cell set up."""

    def __init__(self, ctx: WorkerContext, decoder: Decoder) -> None:
        self.W = importlib.import_module(f"bench.workloads.{decoder.workload}")
        reason = self.W.unavailable_reason()
        if reason is not None:
            raise RuntimeError(reason)
        self.ctx, self.cell, self.decoder = ctx, ctx.cell, decoder
        self.model = self.stream = self.binding = None
        ctx.result["vendor_version"] = self.W.installed_version()

    def build(self) -> None:
        self.model = self.decoder.build(self.ctx.args, self.ctx.device)
        self.ctx.result["model"] = {"params": sum(p.numel() for p in self.model.parameters())}
        self.stream = self.decoder.open(self.model, self.ctx.args, self.ctx.n_steps)

    def setup(self) -> Any:
        cell, info = self.cell, self.ctx.setup
        if getattr(cell, "bind", False):
            self.binding = self.decoder.bind(self.stream, self.ctx.device)
            self.binding.capture(progress=False)
        elif getattr(cell, "compile_mode", None):
            self._compile(cell.compile_mode, info)
        elif cell.name != "stock":
            assert self.decoder.extra_setup is not None, cell.name
            self.decoder.extra_setup(cell, self.stream, info)
        return self.binding

    def _compile(self, mode: str, info: dict) -> None:
        import torch

        args = self.ctx.args  # from here to the end of the worker, every compile included
        arm_compile_budget(
            max(1.0, min(args.compile_timeout, args.worker_timeout - 45.0)), self.ctx
        )
        owner, attr = self.decoder.compile_site(self.stream)
        kwargs = {"mode": mode, "dynamic": False, "fullgraph": False}
        info.update(compile_kwargs=kwargs, compiled=f"{type(owner).__name__}.{attr}")
        info["dynamo_counters_before"] = dynamo_counters()
        try:
            setattr(owner, attr, torch.compile(getattr(owner, attr), **kwargs))
        except Exception as e:  # noqa: BLE001
            raise CellFailed("torch.compile raised while wrapping", f"{type(e).__name__}: {e}")

    def step(self) -> dict:
        return {self.decoder.output: self.stream.step()}

    def after(self, phase: str) -> None:
        info = self.ctx.setup
        if "compile_kwargs" in info and phase == "window":
            window = counters_delta(dynamo_counters(), info["dynamo_counters_after_warmup"])
            info["frames_compiled_in_window"] = window.get("frames", {}).get("total", 0)
        elif "compile_kwargs" in info and phase == "warmup":
            info["dynamo_counters_after_warmup"] = dynamo_counters()

    def finish(self, result: dict) -> None:
        if self.binding is not None:
            result.update(catalog_check(self.binding, self.decoder.adapter))


def catalog_check(binding: Any, adapter: str) -> dict:
    """The catalog ``clockc`` predicted against the classes the run met (every call of
    the worker: warm-up, window, profile). A signature outside the catalog is a miss and
    shows as ``miss:<reason>``."""
    contract = importlib.import_module(f"duplexcadence.generated.{adapter}.contract")
    predicted = sorted(
        f"{name}[{c.name}]" for name, classes in contract.CATALOG.items() for c in classes
    )
    observed = set()
    for name, s in binding.stats()["callables"].items():
        observed |= {f"{name}[{c['name']}]" for c in s.get("classes", []) if c.get("hits")}
        observed |= {f"{name}[miss:{reason}]" for reason, n in s.get("misses", {}).items() if n}
    return {
        "catalog_predicted": predicted,
        "signatures_observed": sorted(observed),
        "catalog_met": sorted(observed) == predicted,
    }


def adapter_summary(results: list) -> dict:
    """cell_summary: the catalog check of every ok block (a bound cell only)."""
    ok = [r for r in results if r and r.get("status") == "ok" and "catalog_met" in r]
    if not ok:
        return {}
    return {
        "catalog_met_every_block": all(r["catalog_met"] for r in ok),
        "signatures_observed": ok[0]["signatures_observed"],
    }


def adapter_notes(name: str, c: Mapping[str, Any]) -> list[str]:
    if "catalog_met_every_block" not in c:
        return []
    met = "met" if c["catalog_met_every_block"] else "NOT met"
    return [
        f"- **{name}** predicted catalog {met} in every block: observed "
        f"{', '.join(c.get('signatures_observed') or [])}"
    ]


# The decoders' own flag ({flag: argparse keywords}), forwarded to workers.
FLAGS = {
    "--compile-timeout": dict(
        type=float,
        default=300.0,
        help="compile cells: seconds from set-up to the end of the worker; past it the "
        "worker reports status 'failed'",
    )
}


DOC_KEYS = ("vendor_version", "model", "catalog_predicted", "signatures_observed")
