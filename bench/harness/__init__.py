"""One benchmark harness that knows no model (DESIGN §6).

A workload module declares a ``Workload`` (``workload.py``) and calls
``main(WORKLOAD)``; the rest is the same for every workload: ``process`` (fresh worker
processes), ``worker`` (one (block, cell): determinism envelope, phases, memory, stream
hashes), ``profile`` (part timing, profiler summary), ``stats`` (pandas, scipy.stats),
``report`` (markdown, PNG), ``driver`` (matched blocks, time budget, --merge),
``document`` (the result JSON, --rerender), ``cli``.
"""

from .cli import main, parse_args
from .workload import Cell, CellFailed, Run, Stream, WorkerContext, Workload

__all__ = ["Cell", "CellFailed", "Run", "Stream", "WorkerContext", "Workload", "main", "parse_args"]
