"""The result document: its envelope, settings, method, cells and blocks; --rerender.

The document is the one place a run is described: the command of every call, the git
commit, torch/CUDA/cuDNN/GPU versions, the determinism envelope and how it held, the
settings, the method (which the markdown quotes), every cell's summary
(``stats.aggregate``) and the raw worker results by block.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
from pathlib import Path
from typing import Any, Mapping, Sequence

from duplexcadence.runtime.controls import DISABLE_ENV

from . import report
from .process import git_info, write_json
from .stats import aggregate, reference_check
from .worker import ENVELOPE, env_keys
from .workload import Workload


def cell_env(wl: Workload, cell: str, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The worker environment of a cell: replay on unless the cell says otherwise."""
    env = dict(os.environ if base is None else base)
    env.pop(DISABLE_ENV, None)
    for k, v in {**wl.base_env, **wl.cell(cell).env}.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    return env


def first_ok(blocks: list[dict], key: str) -> Any:
    """``key`` of the first worker result that ran ok and has it."""
    oks = (r for b in blocks for r in b["results"].values() if r.get("status") == "ok")
    return next((r[key] for r in oks if r.get(key) is not None), None)


def ok_results(doc: dict, cell: str) -> list[dict | None]:
    """``cell``'s ok worker results, one per block (None where the block has none), for a
    workload's headline."""
    out = []
    for b in doc["blocks"]:
        r = b["results"].get(cell)
        out.append(r if r and r.get("status") == "ok" else None)
    return out


def merge_problems(wl: Workload, prior: dict, args: argparse.Namespace) -> list[str]:
    """Why a prior document cannot take this call's results (empty: it can)."""
    old, problems = prior.get("settings") or {}, []
    for k in ("device", "seed", *wl.dests().values(), *wl.measure_flags):
        if k in old and old[k] != getattr(args, k):
            problems.append(f"{k}: {old[k]!r} in the file, {getattr(args, k)!r} now")
    for blk in prior.get("blocks") or []:
        if blk.get("seed") != args.seed + int(blk["block"]):
            problems.append(f"block {blk['block']} has seed {blk.get('seed')}")
    return problems


def merge_blocks(prior_blocks: Sequence[dict], n_blocks: int, seed: int) -> list[dict]:
    """The prior blocks (copied) extended to at least ``n_blocks`` blocks."""
    blocks = [copy.deepcopy(b) for b in prior_blocks]
    have = {int(b["block"]) for b in blocks}
    for b in set(range(n_blocks)) - have:
        blocks.append({"block": b, "seed": seed + b, "order": [], "results": {}})
    return sorted(blocks, key=lambda b: int(b["block"]))


def cells_in(wl: Workload, blocks: Sequence[dict], first: Sequence[str] = ()) -> list[str]:
    """Every cell with a result in some block, in the workload's order."""
    seen = set(first).union(*((b.get("results") or {}).keys() for b in blocks))
    return [c.name for c in wl.cells if c.name in seen] + sorted(seen - set(wl.by_name))


def method(wl: Workload) -> dict[str, str]:
    u, parts = wl.unit, "/".join(wl.parts)
    return {
        "window": f"per-{u} wall: time.perf_counter between two torch.cuda.synchronize() calls "
        "(CUDA), nothing else instrumented; outputs hashed after the timing",
        "aggregation": "p50/p95: per-block median / 95th percentile (linear) of the window, "
        "then the median over blocks",
        "ratios": f"per-block paired ratio against {', '.join(wl.refs)}; geometric mean with a "
        "95% t-interval on log ratios (df = blocks - 1; none with one block)",
        "busy": f"separate torch.profiler pass (CPU+CUDA): kernel-time sum per {u}, kernels "
        f"executed, host kernel-launch calls (+ graph launches) per {u}; null on CPU",
        **({"split": f"{parts}: separate pass, each part synchronised and timed"} if parts else {}),
        "memory": "torch.cuda.max_memory_allocated, reset at each phase boundary; process peak "
        "= max over phases; window peak = the measured window's",
        "exact": "SHA-256 of every output stream ("
        + ", ".join(f"{s.name}: {s.dtype}" for s in wl.streams)
        + f") over every streamed {u} equals the {wl.reference} cell's in every block",
        "order": "cells rotated left by the block index (cyclic Latin square), every (block, "
        "cell) in a fresh process; with --merge, cells of several calls are paired by block",
        **wl.method,
    }


def settings(wl: Workload, args: argparse.Namespace, blocks: list, cells: list) -> dict:
    return {
        "device": args.device,
        "blocks": len(blocks),
        **{dest: getattr(args, dest) for dest in wl.dests().values()},
        "seed": args.seed,
        "block_seeds": [b["seed"] for b in blocks],
        "cells": cells,
        "threads": args.threads,
        "worker_timeout_s": args.worker_timeout,
        "time_budget_s": args.time_budget,
        "quick": args.quick,
        "env": {c: {k: cell_env(wl, c, {}).get(k) for k in env_keys(wl)} for c in cells},
        **wl.settings(args),
    }


def build(
    wl: Workload,
    args: argparse.Namespace,
    blocks: list[dict],
    calls: list[dict],
    cells: list[str],
    not_run: Mapping[str, str],
) -> dict:
    import torch

    agg = aggregate(wl, blocks, cells)
    agg_reference = reference_check(wl, blocks)
    docs: dict[str, Any] = {}
    for c in wl.cells:
        absent = {"status": "not run", "reason": not_run.get(c.name, "not in --cells")}
        docs[c.name] = {"what": c.what, **agg.get(c.name, absent)}
    for name in cells:  # cells of a merged file this workload no longer has
        docs.setdefault(name, {"what": "", **agg[name]})
    ok = [r for b in blocks for r in b["results"].values() if r.get("status") == "ok"]
    read_back = {
        c: [b["results"][c].get("determinism") for b in blocks if c in b["results"]] for c in cells
    }
    doc = {
        "benchmark": wl.name,
        "command": calls[-1]["command"],
        "commands": [c["command"] for c in calls],
        "calls": calls,
        **git_info(args.git_commit),
        "torch": first_ok(blocks, "torch") or torch.__version__,
        "cuda": first_ok(blocks, "cuda") or torch.version.cuda,
        "cudnn": first_ok(blocks, "cudnn"),
        "gpu": first_ok(blocks, "device_name"),
        "hosts": sorted({r["hostname"] for r in ok if r.get("hostname")}),
        "python": platform.python_version(),
        **{k: first_ok(blocks, k) for k in wl.doc_keys},
        "envelope": {**ENVELOPE, **wl.determinism},
        "reference_reproducible": agg_reference["reproducible"],
        "reference_check": agg_reference,
        "determinism": {
            "envelope": {**ENVELOPE, **wl.determinism},
            "pinned_in_every_cell": True,
            "held_in_every_worker": bool(ok) and all(r.get("determinism_ok") for r in ok),
            "read_back_per_cell": read_back,
        },
        "settings": settings(wl, args, blocks, cells),
        "method": method(wl),
        "cells": docs,
        "blocks": blocks,
    }
    return with_headline(wl, doc)


def with_headline(wl: Workload, doc: dict) -> dict:
    """``doc`` with the workload's headline keys after "benchmark" (recomputed)."""
    head = wl.headline(doc)
    return {
        "benchmark": doc["benchmark"],
        **head,
        **{k: v for k, v in doc.items() if k not in head},
    }


def artefact(out: Path | str, suffix: str) -> Path:
    """``--out``'s file with ``suffix`` appended: ``--out`` has none of its own, and a dot
    in it is part of the name (``as2d_eps0.5`` -> ``as2d_eps0.5.json``, not ``as2d_eps0.json``)."""
    out = Path(out)
    return out.with_name(out.name + suffix)


def write_reports(wl: Workload, doc: dict, out: Path) -> None:
    md = report.markdown(wl, doc)
    report.plot(wl, doc, artefact(out, ".png"))
    artefact(out, ".md").write_text(md)
    print(md)


def rerender(wl: Workload, path: Path) -> int:
    """Re-aggregate an existing result JSON and rewrite its .json/.md/.png; runs nothing."""
    doc = json.loads(Path(path).read_text())
    cells = list(doc["settings"]["cells"])
    agg = aggregate(wl, doc["blocks"], cells)
    for name in cells:
        what = doc["cells"].get(name, {}).get("what") or getattr(wl.by_name.get(name), "what", "")
        doc["cells"][name] = {"what": what, **agg[name]}
    doc = with_headline(wl, doc)
    out = Path(path).with_suffix("")  # the result JSON's own path, less its .json
    write_json(artefact(out, ".json"), doc)
    write_reports(wl, doc, out)
    return 0
