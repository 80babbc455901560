"""Token2Wav benchmark on ``minicpmo-utils==1.0.7`` (issue 14): stock vs controls.

    python -m bench.token2wav107 --device cuda --blocks 2 --chunks 12 --warmup 3 \\
        --out bench/results/token2wav107_h200
    python -m bench.token2wav107 --quick          # CPU smoke: 1 block, B0, 2 chunks

The same driver as ``bench/token2wav.py`` (its ``Token2WavRun``, cells and report
hooks) over ``bench.workloads.token2wav107``: importing that module puts
``.vendor/minicpmo-utils-1.0.7`` first on ``sys.path`` in the driver and in every
worker. Cells: B0 and the torch.compile controls (compile sites: the flow's
``inference_chunk`` and the causal vocoder's ``decode``), plus ``vllm_omni_exact``,
vllm-omni 0.30.0's ``CFMGraphWrapper`` on the stock estimator
(``bench.workloads.vllm_omni_graphs``), and the adapter cells S and SRc, the 1.0.6 cells
bound to ``stepaudio2_token2wav107`` (``contracts/stepaudio2_token2wav107.clock``).
"""

from __future__ import annotations

import dataclasses

from bench import token2wav as v106
from bench.harness import main
from bench.workloads import token2wav107  # noqa: F401  (puts 1.0.7 first on sys.path)


class Token2Wav107Run(v106.Token2WavRun):
    RELEASE = "token2wav107"
    WORKLOAD_MODULE = "bench.workloads.token2wav107"
    COMPILE_SITES = ("flow.inference_chunk", "hift.decode")

    def setup(self):
        binding = super().setup()
        if self.cell.name == "vllm_omni_exact":
            from bench.workloads import vllm_omni_graphs

            wrapper = vllm_omni_graphs.bind_cfm_graphs(self.model)
            self.ctx.setup["vllm_omni"] = {"version": vllm_omni_graphs.VERSION}
            self.vllm_omni = wrapper
        return binding

    def finish(self, result: dict) -> None:
        super().finish(result)
        if self.cell.name == "vllm_omni_exact":
            self.ctx.setup["vllm_omni"]["stats"] = self.vllm_omni.stats_snapshot()


ADAPTER = "stepaudio2_token2wav107"  # contracts/stepaudio2_token2wav107.clock
_CELL = {c.name: c for c in v106.CELLS}
CELLS = (
    _CELL["B0"],
    dataclasses.replace(_CELL["S"], adapter=ADAPTER),
    dataclasses.replace(
        _CELL["SRc"],
        adapter=ADAPTER,
        what="state rule + replay at the chunk clock: flow.inference_chunk (encoder + "
        "10-step solver; the conformer carry staged) and the bounded vocoder's F0 predictor "
        "and decode captured, one graph per catalog class; _source and misses run eager",
    ),
    *v106.COMPILE_CELLS,
    v106.T2WCell(
        "vllm_omni_exact",
        "control: vllm-omni 0.30.0 CFMGraphWrapper (exact-signature DiT step graphs, cache "
        "of 32 flushed when full) bound on the stock estimator's blocks_forward_chunk",
        needs_cuda=True,
    ),
)

WORKLOAD = dataclasses.replace(
    v106.WORKLOAD,
    name="token2wav107",
    module="bench.token2wav107",
    cells=CELLS,
    start=Token2Wav107Run,
    title=lambda doc: "Token2Wav streaming benchmark (minicpmo-utils "
    f"{doc.get('minicpmo_utils') or '1.0.7'}, seeded random weights, fp32, batch 1)",
    description="Matched-block benchmark of the stock streaming Token2Wav of minicpmo-utils "
    "1.0.7 (bounded causal vocoder, seeded random weights) against its controls.",
    parts={"flow": "flow.inference_chunk", "vocoder": "bounded_vocoder.stream"},
    quick={**v106.WORKLOAD.quick, "cells": ["B0"], "out": "bench/results/token2wav107_quick"},
)

if __name__ == "__main__":
    raise SystemExit(main(WORKLOAD))
