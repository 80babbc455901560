"""Where a Moshi lockstep tick's time goes: the tick of ``bench.sessions_moshi``'s
``LockstepSessions`` (the adapter bound at ``batch=W``) at each width, every slot
running, its three graphs timed apart with CUDA events (Mimi encode, the LM step with
the depformer, Mimi decode) and the whole tick by the wall clock. CUDA only.

    python -m bench.lockstep_ticks --width 16 --ticks 30 --out lockstep_ticks_16.json

One width per process: on the H200 a second binding's LM capture in the same process
was invalidated (cudaErrorStreamCaptureInvalidated) where a fresh process captured it.

A tick's time is what bounds sessions per GPU: with ticks of T ms every frame is served
within 2T (it waits for the tick in progress, then runs in the next), so the 160 ms
deadline of an 80 ms cadence holds while T <= 80 ms minus the gather window.
``--rows CALLABLE=OPS`` tries other per-row ops; they are proven at bind first
(``--prove FRAMES``, the proven arms' ``prove_lockstep``), and a width they do not hold
at is reported refused, with the broken ops, not timed. ``outputs_sha256`` alone is no
evidence: on the H100 at 32, gating-only rows gave the contract's hash over 30 ticks
while the proof named every attention output projection and sessions diverged from
their solo runs (bench/results/sessions_moshi_h100.md). ``--rows-off`` binds with no
per-row op (every kernel batched whole): not exact, the floor that says what running the
contract's ``rows`` one session at a time costs.
``--row-streams K`` runs each per-row op's blocks on K side streams (0: one after the
other; runtime/engine/per_row.py). ``outputs_sha256`` hashes every tick's token IDs and
float32 PCM, every row: two processes at one width that differ only in how the per-row
blocks are scheduled must give the same hash (the same kernels on the same shapes)."""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import sys
import time

import torch

from bench.cadence import Arm
from bench.sessions_moshi import PROOF_FRAMES, LockstepSessions
from bench.workloads import moshi as W
from duplexcadence.runtime import LockstepNotProven, determinism_settings, pin_determinism


def width_ticks(
    width: int,
    ticks: int,
    warmup: int,
    device: torch.device,
    lm_kwargs: dict | None = None,
    prove_frames: int = 0,
) -> dict:
    t = time.perf_counter()
    options = {"width": width, **({"prove_frames": prove_frames} if prove_frames else {})}
    arm = Arm(f"batch{width}", "inproc", "", options)
    try:
        server = LockstepSessions(arm, device, lm_kwargs)
    except LockstepNotProven as e:  # the rows do not hold at this width on this device
        return {"width": width, "proven": False, "refused": str(e)}
    setup_s = time.perf_counter() - t
    server.pool.shut_down()  # the ticks are driven here, every slot in
    frames = [torch.cat(W.pcm_stream(1000 + r, warmup + ticks)) for r in range(width)]
    frames = torch.stack(frames, 1).to(device)  # [frame, width, 1, 1920]: a tick's rows
    walls, outputs = [], hashlib.sha256()
    for f in range(warmup + ticks):
        if f == warmup:
            server.stage_ms = []
        t = time.perf_counter()
        out = server.tick(frames[f])
        walls.append((time.perf_counter() - t) * 1e3)
        outputs.update(out["tokens"].numpy().tobytes())
        outputs.update(out["pcm"].numpy().tobytes())
    stages = list(zip(*server.stage_ms))
    replay = {k: (c["hits"], c["misses"]) for k, c in server.binding.stats()["callables"].items()}
    row = {
        "width": width,
        "setup_s": round(setup_s, 2),
        "tick_ms_p50": round(statistics.median(walls[warmup:]), 2),
        "tick_ms_max": round(max(walls[warmup:]), 2),
        **{
            f"{name}_ms_p50": round(statistics.median(v), 2)
            for name, v in zip(("mimi_encode", "lm_step", "mimi_decode"), stages)
        },
        "ms_per_session": round(statistics.median(walls[warmup:]) / width, 2),
        "replay_hits_misses": replay,
        "row_streams": len(server.binding.rows.streams),
        "outputs_sha256": outputs.hexdigest(),
    }
    if server.binding.lockstep_proof is not None:
        row["proven"] = True
        row["proof"] = server.binding.lockstep_proof.summary()
    server.binding.unbind()
    del server
    if device.type == "cuda":
        row["peak_gib"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 1)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    return row


def read_rows(ops: str) -> dict[str, int]:
    """``OPS`` read as a contract's ``rows {OPS}`` (the DSL's own parser): each per-row
    op (``aten.mm.default in transformer.layers.*.gating``) with its block."""
    from duplexcadence.dsl.parser import parse

    text = (
        "contract probe\nclock f = 1 per call\ncallable c {\n  site c\n  per f\n"
        f"  batch widths {{1}} rows {{{ops}}}\n}}\n"
    )
    contract, diagnostics = parse(text)
    if diagnostics or not contract.callables:
        why = diagnostics[0].message if diagnostics else "no rows"
        raise SystemExit(f"bench.lockstep_ticks: --rows: cannot read '{ops}': {why}")
    batch = contract.callables[0].batch
    return dict(zip(batch.rows, batch.row_blocks()))


def override_rows(specs: list[str]) -> None:
    """``--rows``: each named callable of contracts/moshi.clock runs the given per-row ops
    (the contract's own syntax, ``aten.mm.default in transformer.layers.*.gating by 8``)."""
    from duplexcadence.generated.moshi.contract import DECLARED
    from duplexcadence.runtime.serving.declared import BatchDecl

    wanted: dict[str, dict[str, int]] = {}
    for spec in specs:
        name, _, ops = spec.partition("=")
        wanted.setdefault(name.strip(), {}).update(read_rows(ops))
    declared = {k.name: k.batch for k in DECLARED.callables if k.batch is not None}
    unknown = set(wanted) - set(declared)
    if unknown:
        raise SystemExit(f"bench.lockstep_ticks: --rows: no batched callable {sorted(unknown)}")
    by_rows = {(declared[n].rows, declared[n].blocks): ops for n, ops in wanted.items()}
    contract_rows = BatchDecl.row_ops
    BatchDecl.row_ops = lambda self: by_rows.get((self.rows, self.blocks)) or contract_rows(self)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--width", type=int, required=True, help="sessions per tick (a declared width)")
    p.add_argument("--ticks", type=int, default=30)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--rows-off", action="store_true", help="no per-row ops (inexact floor)")
    p.add_argument(
        "--row-streams", type=int, help="side streams for per-row blocks (default: the runtime's)"
    )
    p.add_argument(
        "--rows",
        action="append",
        default=[],
        metavar="CALLABLE=OP[ in MODULE][ by N],...",
        help="run these per-row ops instead of the contract's for CALLABLE (an experiment; "
        f"proven at bind over {PROOF_FRAMES} frames unless --prove says otherwise)",
    )
    p.add_argument(
        "--prove",
        type=int,
        metavar="FRAMES",
        help="prove the rows at the width over FRAMES frames before binding (the proven "
        f"arms' prove_lockstep; default {PROOF_FRAMES} with --rows, else 0: no proof)",
    )
    p.add_argument("--tiny-cpu", action="store_true", help="a dry run: the tiny LM on the CPU")
    p.add_argument("--out", help="JSON path (default: stdout only)")
    args = p.parse_args(argv)
    if args.rows_off:
        from duplexcadence.runtime.serving.declared import BatchDecl

        BatchDecl.row_ops = lambda self: {}  # every kernel batched whole
    if args.rows:
        override_rows(args.rows)
    if args.row_streams is not None:
        from duplexcadence.runtime.engine import per_row

        per_row.ROW_STREAMS = args.row_streams
    if not (args.tiny_cpu or torch.cuda.is_available()):
        print("bench.lockstep_ticks: needs a CUDA device (or --tiny-cpu)", file=sys.stderr)
        return 2
    device = torch.device("cpu" if args.tiny_cpu else "cuda")
    lm_kwargs = W.TINY_LM_KWARGS if args.tiny_cpu else W.FULL_7B
    rows: list[dict] = []
    with pin_determinism(extra=W.DETERMINISM):
        prove = args.prove if args.prove is not None else PROOF_FRAMES if args.rows else 0
        if prove and args.rows_off:
            raise SystemExit("bench.lockstep_ticks: --rows-off is inexact by design: no --prove")
        rows.append(width_ticks(args.width, args.ticks, args.warmup, device, lm_kwargs, prove))
        rows[-1]["rows"] = (
            "off (inexact)" if args.rows_off else args.rows if args.rows else "as declared"
        )
        print(json.dumps(rows[-1]), flush=True)
        env = determinism_settings(device)
    doc = {
        "command": "python -m bench.lockstep_ticks " + " ".join(argv or sys.argv[1:]),
        "torch": env["torch"],
        "device": env["device"],
        "rows": rows,
    }
    if args.out:
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
