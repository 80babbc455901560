"""One benchmark harness that knows no model (DESIGN §6).

A workload module declares a ``Workload`` (``workload.py``): its cells, its unit
(chunk, frame), the output streams to hash, the ``Run`` that builds, sets up and steps
the released model inside a worker, and hooks for its own fields and report notes;
then ``main(WORKLOAD)``. The harness does the rest, the same for every workload:

  workload  Cell, Stream, Workload, Run, WorkerContext, CellFailed: what is declared
  process   fresh worker processes, result files, git facts
  worker    one (block, cell) in its process: determinism envelope (the runtime's
            ``pin_determinism``), phases, memory per phase, stream hashes, one JSON line
  profile   part-by-part timing and the torch.profiler summary
  stats     per-block rows, medians, paired ratios (pandas, scipy.stats), exactness
  report    the markdown table and the PNG (by unit and reference cell)
  driver    matched blocks, Latin-square order, the one time-budget policy, --merge,
            --missing-only, the result document, --rerender
  cli       the shared command line
"""

from .cli import main, parse_args
from .workload import Cell, CellFailed, Run, Stream, WorkerContext, Workload

__all__ = ["Cell", "CellFailed", "Run", "Stream", "WorkerContext", "Workload", "main", "parse_args"]
