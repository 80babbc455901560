"""Which kernels of the released Moshi are batch-invariant: row 0 of a batch-B stream
against the batch-1 stream, op by op (``runtime/tools/batch_rows.py``), and end to end.
CUDA only (the widths and kernels that matter are the GPU's).

    python -m bench.batch_rows --widths 2,4,8,16,32 --frames 6 --out batch_rows.json

The 7B LM (bf16, seeded random weights, greedy) and Mimi stream ``--frames`` 80 ms
frames under the Moshi reference envelope (cuDNN deterministic, cuDNN attention off:
``bench.workloads.moshi.DETERMINISM``), first at batch 1 (session 0's seeded PCM),
then at each width with session 0 in row 0 and other sessions' PCM in the other rows.
Two probes: ``frame`` (Mimi encode, the LM step, Mimi decode) and ``lm`` (the LM
alone, row 0 fed the batch-1 stream's codes, the other rows random codes). Per probe and
width: the op-by-op proof (ops compared, the ops whose row 0 differed although
their inputs' row 0 did not, by component), and ``end_to_end``: whether an unchecked
batched stream's row-0 token IDs and float32 PCM equal the batch-1 stream's, frame by
frame (the first frame that differs). ``--per-row OPS`` runs those ops one row at a
time in every batched run (``PerRow``: the fallback for a kernel the proof named)."""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
import types

import torch

from bench.workloads import moshi as W
from duplexcadence.runtime.engine.determinism import apply_settings
from duplexcadence.runtime.engine.module_scope import module_paths
from duplexcadence.runtime.tools.batch_rows import PerRow, prove_rows, weight_storages


def component(module: str) -> str:
    """A module path as the component it belongs to: layer indices folded, three parts
    (``lm_gen.lm_model.transformer``, ``lm_gen.lm_model.depformer``, ``mimi.decoder``)."""
    parts = [p for p in re.sub(r"\.\d+(?=\.|$)", "", module).split(".") if p]
    return ".".join(parts[:3]) or "<top>"


def frames_at(width: int, n_frames: int) -> list[torch.Tensor]:
    """Row r holds session r's seeded PCM (``W.pcm_stream(r, ...)``): row 0 is the
    batch-1 stream's."""
    rows = [W.pcm_stream(r, n_frames) for r in range(width)]
    return [torch.cat([rows[r][f] for r in range(width)]) for f in range(n_frames)]


def stream(model, width: int, frames: list[torch.Tensor], rows: int = 1) -> list[tuple]:
    """The first ``rows`` rows' (token IDs, PCM) per frame of a stream at ``width``
    (None before the LM's first output)."""
    from moshi.utils.compile import no_cuda_graph

    out = []
    with (
        torch.no_grad(),
        no_cuda_graph(),
        model.mimi.streaming(width),
        model.lm_gen.streaming(width),
    ):
        for chunk in frames:
            toks, pcm = W.step_frame(model.mimi, model.lm_gen, chunk)
            out.append((toks[0][:rows].cpu(), pcm[0][:rows].float().cpu()) if toks else None)
    return out


def first_codes(model, frames: list[torch.Tensor]) -> list[torch.Tensor]:
    """Mimi's codes of a batch-1 stream, one (1, 8, 1) step per frame."""
    device = next(model.mimi.parameters()).device
    with torch.no_grad(), model.mimi.streaming(1):
        return [model.mimi.encode(f.to(device)) for f in frames]


def lm_inputs(model, width: int, codes: list[torch.Tensor]) -> list[torch.Tensor]:
    """Per frame, the LM's input at ``width``: row 0 ``codes``, the other rows seeded
    random codes (another session's input: anything). Made before a probe runs, so the
    proof judges the model's ops only."""
    g = torch.Generator().manual_seed(width)
    rows = []
    for c in codes:
        rest = torch.randint(0, model.mimi.cardinality, (width - 1, *c.shape[1:]), generator=g)
        rows.append(torch.cat([c, rest.to(c)]))
    return rows


def lm_stream(model, width: int, inputs: list[torch.Tensor], rows: int = 1) -> list[tuple]:
    """The first ``rows`` rows' token IDs per frame of the LM alone at ``width``
    (``lm_inputs``)."""
    from moshi.utils.compile import no_cuda_graph

    out = []
    with torch.no_grad(), no_cuda_graph(), model.lm_gen.streaming(width):
        for x in inputs:
            tokens = model.lm_gen.step(x)
            out.append(None if tokens is None else (tokens[:rows].cpu(), torch.zeros(0)))
    return out


def row_of(run: list, r: int) -> list:
    """Row ``r`` of a stream's per-frame outputs, as a batch-1 stream's."""
    return [None if x is None else (x[0][r : r + 1], x[1][r : r + 1]) for x in run]


def solo_check(model, probe: str, width: int, n_frames: int, per_row: set[str]) -> dict:
    """Every session of a batched stream against its own solo (batch-1) stream: session
    r's seeded PCM in row r (``frame``), or its Mimi codes (``lm``); the named ops per
    row. No proof, so streams can be long."""
    t0 = time.perf_counter()
    pcm = [W.pcm_stream(r, n_frames) for r in range(width)]
    if probe == "frame":
        solo = [stream(model, 1, pcm[r]) for r in range(width)]
        many = [torch.cat([pcm[r][f] for r in range(width)]) for f in range(n_frames)]
        run = lambda: stream(model, width, many, rows=width)  # noqa: E731
    else:
        codes = [first_codes(model, pcm[r]) for r in range(width)]
        solo = [lm_stream(model, 1, codes[r]) for r in range(width)]
        many = [torch.cat([codes[r][f] for r in range(width)]) for f in range(n_frames)]
        run = lambda: lm_stream(model, width, many, rows=width)  # noqa: E731
    with PerRow(per_row, width, weight_storages(model), modules=module_paths(model)):
        batched = run()
    firsts = [first_difference(solo[r], row_of(batched, r)) for r in range(width)]
    return {
        "frames": n_frames,
        "sessions_exact": sum(f is None for f in firsts),
        "first_difference_by_session": firsts,
        "seconds": round(time.perf_counter() - t0, 1),
    }


def first_difference(one: list, many: list) -> int | None:
    for f, (a, b) in enumerate(zip(one, many)):
        if (a is None) != (b is None):
            return f
        if a is not None and not (torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])):
            return f
    return None


def rollup(proof) -> dict:
    """{component: {op: [compared, broken]}} of one width's proof."""
    out: dict[str, dict[str, list[int]]] = {}
    for key, n in proof.compared.items():
        op, _, module = key.partition(" in ")
        out.setdefault(component(module), {}).setdefault(op, [0, 0])[0] += n
    for v in proof.broken:
        out.setdefault(component(v.module), {}).setdefault(v.op, [0, 0])[1] += 1
    return {c: dict(sorted(ops.items())) for c, ops in sorted(out.items())}


def broken_ops(row: dict) -> str:
    """The broken ops of one width, by component: ``op (broken/compared)``."""
    parts = []
    for comp, ops in row["components"].items():
        for op, (compared, broken) in ops.items():
            if broken:
                parts.append(f"{comp}: {op.removeprefix('aten.')} ({broken}/{compared})")
    return "; ".join(parts) or "none"


def render(doc: dict) -> str:
    """The results document as markdown (bench/results/batch_rows_moshi_h200.md)."""
    lines = [f"# {doc['what']}", ""]
    for run in doc["runs"]:
        lines += [
            f"`{run['command']}`",
            "",
            f"{run['model']}; {run['device']}, torch {run['torch']}, {run['frames']} frames; "
            f"run per row: {', '.join(run.get('per_row') or []) or 'nothing'}",
            "",
            "| probe | width | ops compared | broken | proven | end to end differs at frame"
            " | broken ops (broken/compared) |",
            "|---|---:|---:|---:|---|---:|---|",
        ]
        if "solo" in run:
            lines[-2:] = [
                "| probe | width | frames | sessions equal to their solo run | first differing"
                " frame by session |",
                "|---|---:|---:|---:|---|",
            ]
            for probe, widths in run["solo"].items():
                for width, row in widths.items():
                    firsts = ", ".join(
                        "-" if f is None else str(f) for f in row["first_difference_by_session"]
                    )
                    lines.append(
                        f"| {probe} | {width} | {row['frames']} | "
                        f"{row['sessions_exact']}/{width} | {firsts} |"
                    )
        for probe in ("frame", "lm"):
            for width, row in run.get(probe, {}).items():
                first = row["end_to_end_first_difference"]
                lines.append(
                    f"| {probe} | {width} | {row['ops']} | {row['broken']} | "
                    f"{'yes' if row['proven'] else 'no'} | {'-' if first is None else first} | "
                    f"{broken_ops(row)} |"
                )
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--widths", default="2,4,8,16,32", help="batch widths to prove")
    p.add_argument("--frames", type=int, default=6, help="80 ms frames per stream")
    p.add_argument("--seed", type=int, default=0, help="the weights' seed")
    p.add_argument("--probes", default="frame,lm", help="which probes: frame, lm")
    p.add_argument(
        "--per-row",
        default="",
        help="ops to run one row at a time in the batched runs (e.g. aten.mean.dim)",
    )
    p.add_argument(
        "--keep-gib", type=float, default=4.0, help="batch-1 outputs kept for repair (GiB)"
    )
    p.add_argument(
        "--solo",
        action="store_true",
        help="no proof: every session of each width against its own solo stream",
    )
    p.add_argument("--render", help="write this results JSON's markdown beside it, and stop")
    p.add_argument("--out", help="also write the JSON here after every width (a partial run)")
    p.add_argument(
        "--tiny", action="store_true", help="the tiny LM on the CPU (tries the driver only)"
    )
    args = p.parse_args()
    if args.render:
        with open(args.render) as f:
            text = render(json.load(f))
        with open(args.render.removesuffix(".json") + ".md", "w") as f:
            f.write(text)
        return
    device, lm_kwargs = "cuda", W.FULL_7B
    if args.tiny:
        device, lm_kwargs = "cpu", {**W._loaders()._lm_kwargs, **W.TINY_SHRINK}
    elif not torch.cuda.is_available():
        raise SystemExit("bench.batch_rows: needs CUDA (the kernels it judges are the GPU's)")
    widths = [int(w) for w in args.widths.split(",") if w]
    settings = {"cudnn.deterministic": True, "cudnn.benchmark": False, **W.DETERMINISM}
    apply_settings(settings)
    t0 = time.perf_counter()
    mimi, lm_gen = W.build_moshi(args.seed, device, torch.bfloat16, lm_kwargs, start=False)
    model = types.SimpleNamespace(mimi=mimi, lm_gen=lm_gen)
    out: dict = {
        "command": " ".join(["python -m bench.batch_rows", *sys.argv[1:]]),
        "model": f"moshi {'tiny' if args.tiny else '7B'} bf16 + Mimi (seeded random weights, greedy)",
        "moshi": W.installed_version(),
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "settings": settings,
        "frames": args.frames,
        "build_s": round(time.perf_counter() - t0, 1),
    }
    one = frames_at(1, args.frames)
    codes = first_codes(model, one)
    # (probe, the batch-1 run, the run at a width): the whole frame (Mimi encode, LM,
    # Mimi decode), and the LM alone on the batch-1 stream's codes
    probes = {
        "frame": (lambda: stream(model, 1, one), lambda w, rows: stream(model, w, rows)),
        "lm": (lambda: lm_stream(model, 1, codes), lambda w, rows: lm_stream(model, w, rows)),
    }
    keep = int(args.keep_gib * (1 << 30))
    per_row = {op for op in args.per_row.split(",") if op}
    out["per_row"] = sorted(per_row)
    for name in [p for p in args.probes.split(",") if p]:
        if args.solo:
            for width in widths:
                row = solo_check(model, name, width, args.frames, per_row)
                out.setdefault("solo", {}).setdefault(name, {})[str(width)] = row
                print(f"solo {name} width {width}: {row}", flush=True, file=sys.stderr)
                if args.out:
                    with open(args.out, "w") as f:
                        json.dump(out, f, indent=1)
            continue
        run_one, run_at = probes[name]
        reference = run_one()
        for width in widths:
            t0 = time.perf_counter()
            many = (
                frames_at(width, args.frames) if name == "frame" else lm_inputs(model, width, codes)
            )
            with PerRow(per_row, width, weight_storages(model), modules=module_paths(model)):
                batched = run_at(width, many)
            proof = prove_rows(
                model, run_one, lambda: run_at(width, many), width, keep, per_row=per_row
            )
            row = {
                "end_to_end_first_difference": first_difference(reference, batched),
                **proof.summary(),
                "components": rollup(proof),
                "seconds": round(time.perf_counter() - t0, 1),
            }
            out.setdefault(name, {})[str(width)] = row
            print(
                f"{name} width {width}: end to end differs at frame "
                f"{row['end_to_end_first_difference']}, {proof.ops} ops compared, "
                f"{len(proof.broken)} broken ({row['broken_unrepaired']} unrepaired)",
                flush=True,
                file=sys.stderr,
            )
            if args.out:
                with open(args.out, "w") as f:
                    json.dump(out, f, indent=1)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
