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
time in every batched run (``PerRow``: the fallback for a kernel the proof named).

``--model token2wav`` asks the same of the released Token2Wav (minicpmo-utils 1.0.6,
seeded random weights, issue 24 item 5): its hot call is the DiT estimator's Euler step
(ten per 25-token chunk, CFG's two rows per session). Probes ``estimator`` (float32, the
deployment the sessions run) and ``estimator_fp16`` (the vendor's ``float16`` switch:
autocast float16). Session s (its own voice prompt, of one length for all, and token
stream) streams alone to chunk ``--chunk``, whose ten steps' inputs are recorded; a width
stacks sessions 0..B-1 session-major on each input's batch axis, the DiT's two scratch
caches widened to match. ``--frames`` is the number of steps compared. HiFT is not
probed: it draws its noise from the device RNG inside the call, and a batch draws
another stream than B calls (not a kernel property; it would need the noise as input)."""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import re
import shlex
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


# The DiT estimator's inputs and their batch axes (decoder_dit.py DiT.forward_chunk's
# docstring: x, mu, cond (b, c, t); t (b,); spks (b, c); cnn_cache (depth, b, c, 2);
# att_cache (depth, b, heads, t, 2 * head_dim)). b is 2 per session: CFG's conditional
# and unconditional rows (solve_euler_chunk).
ESTIMATOR_BATCH_AXIS = {
    "x": 0,
    "mu": 0,
    "t": 0,
    "spks": 0,
    "cond": 0,
    "cnn_cache": 1,
    "att_cache": 1,
}


def estimator_steps(t2w, session: int, chunk: int, fp16: bool) -> list[dict]:
    """The estimator's inputs at each Euler step of chunk ``chunk`` of session
    ``session``'s batch-1 stock stream (the sessions benchmark's view of one session:
    its voice prompt ``Voice(session, ...)`` at the model's prompt length, primed; its
    ``token_stream``), cloned as the vendor passed them."""
    from bench.sessions_token2wav import Voice, prime, session_view
    from bench.workloads import token2wav as T

    est, calls = t2w.flow.decoder.estimator, []
    vendor = est.forward_chunk

    def record(**kwargs):
        calls.append({k: v.clone() for k, v in kwargs.items()})
        return vendor(**kwargs)

    view = session_view(t2w, Voice(session, t2w.bench.prompt_frames))
    prime(view)
    view.float16 = fp16
    torch.manual_seed(session)
    est.forward_chunk = record  # an instance attribute: the solver's calls come here
    try:
        for c in T.token_stream(session, chunk + 2)[: chunk + 1]:
            calls.clear()  # keep the last chunk's
            T.stream_chunk(view, c.tokens, c.last_chunk)
    finally:
        del est.forward_chunk
    return calls


def stacked(calls: list[dict]) -> dict:
    """Sessions' inputs to one step as one call: session-major on each batch axis."""
    return {k: torch.cat([c[k] for c in calls], ESTIMATOR_BATCH_AXIS[k]) for k in calls[0]}


@contextlib.contextmanager
def estimator_scratch(est, width: int):
    """The DiT's scratch caches (``cnn_cache_buffer``, ``att_cache_buffer``: batch 2, which
    forward_chunk writes each block's new cache into and returns) as fresh zeros for
    ``width`` sessions; the stock ones back after. Fresh at every width, batch 1 too, so
    neither run's are weights to the proof."""
    saved = {n: getattr(est, n) for n in ("cnn_cache_buffer", "att_cache_buffer")}
    for name, buf in saved.items():
        setattr(est, name, buf.new_zeros(buf.shape[0], buf.shape[1] * width, *buf.shape[2:]))
    try:
        yield
    finally:
        for name, buf in saved.items():
            setattr(est, name, buf)


def estimator_run(est, steps: list[dict], width: int, fp16: bool) -> list:
    """Per step, session 0's (velocity, new attention cache; CFG's two rows), float32 on
    the CPU. Under the vendor's own modes: inference, and autocast float16 for fp16."""
    device = steps[0]["x"].device
    autocast = torch.amp.autocast(device.type, dtype=torch.float16, enabled=fp16)
    out = []
    with torch.inference_mode(), autocast, estimator_scratch(est, width):
        for kwargs in steps:
            x, _cnn, att = est.forward_chunk(**kwargs)
            # narrow, not att[:, :2]: indexing a whole dim is an alias, not a slice, so
            # batch 1 and width B would run different ops (a divergence to the proof)
            out.append((x.narrow(0, 0, 2).float().cpu(), att.narrow(1, 0, 2).float().cpu()))
    return out


def token2wav_probes(args, device: str, widths: list[int]) -> tuple[dict, object, dict]:
    """(run description, the model the proof hooks, {probe: (batch-1 run, width -> the
    batched run)}) for the Token2Wav estimator, float32 and float16."""
    from bench.workloads import token2wav as T

    t2w = T.build_token2wav(args.seed, device)
    est = t2w.flow.decoder.estimator
    probes = {}
    for name in [p for p in args.probes.split(",") if p]:
        fp16 = {"estimator": False, "estimator_fp16": True}[name]
        sessions = [
            estimator_steps(t2w, s, args.chunk, fp16)[: args.frames] for s in range(max(widths))
        ]

        def batched(w: int, sessions=sessions, fp16=fp16):
            steps = [stacked([sessions[s][j] for s in range(w)]) for j in range(len(sessions[0]))]
            return functools.partial(estimator_run, est, steps, w, fp16)

        probes[name] = (functools.partial(estimator_run, est, sessions[0], 1, fp16), batched)
    described = {
        "model": "Token2Wav (minicpmo-utils 1.0.6) DiT estimator, seeded random weights; "
        f"chunk {args.chunk}, prompt {t2w.bench.prompt_frames} mel frames for every session",
        "minicpmo_utils": T.installed_version(),
    }
    return described, types.SimpleNamespace(estimator=est), probes


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
    """The results document as markdown (bench/results/batch_rows_moshi_h200.md): one
    table per run."""
    lines = [f"# {doc['what']}", ""]
    for run in doc["runs"]:
        unit = run.get("unit", "frame")
        lines += [
            f"`{run['command']}`",
            "",
            f"{run['model']}; {run['device']}, torch {run['torch']}, {run['frames']} {unit}s; "
            f"run per row: {', '.join(run.get('per_row') or []) or 'nothing'}",
            "",
            f"| probe | width | ops compared | broken | proven | end to end differs at {unit}"
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
        for probe in run.get("probes", ("frame", "lm")):
            for width, row in run.get(probe, {}).items():
                first = row["end_to_end_first_difference"]
                lines.append(
                    f"| {probe} | {width} | {row['ops']} | {row['broken']} | "
                    f"{'yes' if row['proven'] else 'no'} | {'-' if first is None else first} | "
                    f"{broken_ops(row)} |"
                )
        lines.append("")
    return "\n".join(lines)


PROBES = {"moshi": ("frame", "lm"), "token2wav": ("estimator", "estimator_fp16")}
WHAT = {
    "moshi": "Batch invariance of the released Moshi (7B LM bf16 + Mimi), op by op",
    "token2wav": "Batch invariance of the released Token2Wav's DiT estimator, op by op",
}


def moshi_probes(args, device: str, widths: list[int]) -> tuple[dict, object, dict]:
    """(run description, the model the proof hooks, {probe: (batch-1 run, width -> the
    batched run)}): the whole frame (Mimi encode, LM, Mimi decode) and the LM alone on
    the batch-1 stream's codes. A width's inputs are made once, before its runs."""
    lm_kwargs = W.FULL_7B
    if args.tiny:
        lm_kwargs = {**W._loaders()._lm_kwargs, **W.TINY_SHRINK}
    mimi, lm_gen = W.build_moshi(args.seed, device, torch.bfloat16, lm_kwargs, start=False)
    model = types.SimpleNamespace(mimi=mimi, lm_gen=lm_gen)
    one = frames_at(1, args.frames)
    codes = first_codes(model, one)
    probes = {
        "frame": (
            functools.partial(stream, model, 1, one),
            lambda w: functools.partial(stream, model, w, frames_at(w, args.frames)),
        ),
        "lm": (
            functools.partial(lm_stream, model, 1, codes),
            lambda w: functools.partial(lm_stream, model, w, lm_inputs(model, w, codes)),
        ),
    }
    described = {
        "model": f"moshi {'tiny' if args.tiny else '7B'} bf16 + Mimi (seeded random weights, greedy)",
        "moshi": W.installed_version(),
    }
    return described, model, probes


def write(doc: dict, path: str) -> None:
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
    with open(path.removesuffix(".json") + ".md", "w") as f:
        f.write(render(doc))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=sorted(WHAT), default="moshi", help="which released model")
    p.add_argument("--widths", default="2,4,8,16,32", help="batch widths to prove")
    p.add_argument(
        "--frames", type=int, default=6, help="80 ms frames per stream (token2wav: Euler steps)"
    )
    p.add_argument("--chunk", type=int, default=3, help="token2wav: the chunk whose steps run")
    p.add_argument("--seed", type=int, default=0, help="the weights' seed")
    p.add_argument(
        "--probes",
        help="comma-separated (default every one: moshi frame,lm; token2wav estimator,"
        "estimator_fp16)",
    )
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
        help="moshi, no proof: every session of each width against its own solo stream",
    )
    p.add_argument("--render", help="write this results JSON's markdown beside it, and stop")
    p.add_argument("--out", help="also write the JSON (and its markdown) here after every width")
    p.add_argument(
        "--tiny", action="store_true", help="on the CPU (moshi: the tiny LM): tries the driver only"
    )
    args = p.parse_args()
    if args.render:
        with open(args.render) as f:
            text = render(json.load(f))
        with open(args.render.removesuffix(".json") + ".md", "w") as f:
            f.write(text)
        return
    requested = (args.probes or ",".join(PROBES[args.model])).split(",")
    unknown = sorted(set(requested) - set(PROBES[args.model]))
    if unknown:
        p.error(f"--probes: {args.model} has {', '.join(PROBES[args.model])}, not {unknown}")
    args.probes = ",".join(requested)
    if args.solo and args.model != "moshi":
        p.error("--solo runs Moshi's streams only")
    try:
        widths = [int(w) for w in args.widths.split(",") if w]
    except ValueError:
        p.error(f"--widths: comma-separated integers, got {args.widths!r}")
    if not widths or min(widths) < 2:
        p.error(f"--widths: batch widths of at least 2, got {args.widths!r}")
    steps = None  # a token2wav probe compares at most one chunk's Euler steps
    if args.model == "token2wav":
        from bench.workloads.token2wav import N_TIMESTEPS as steps
    if args.frames < 1 or (steps and args.frames > steps):
        p.error(f"--frames: at least 1{f' and at most {steps} (a chunk)' if steps else ''}")
    if args.chunk < 0:
        p.error(f"--chunk: a chunk index (0 or more), got {args.chunk}")
    device = "cpu" if args.tiny else "cuda"
    if not args.tiny and not torch.cuda.is_available():
        raise SystemExit("bench.batch_rows: needs CUDA (the kernels it judges are the GPU's)")
    settings = {"cudnn.deterministic": True, "cudnn.benchmark": False, **W.DETERMINISM}
    apply_settings(settings)
    t0 = time.perf_counter()
    make = {"moshi": moshi_probes, "token2wav": token2wav_probes}[args.model]
    described, model, probes = make(args, device, widths)
    out: dict = {
        "command": shlex.join(["python", "-m", "bench.batch_rows", *sys.argv[1:]]),
        **described,
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "settings": settings,
        "frames": args.frames,
        "unit": "frame" if args.model == "moshi" else "step",
        "probes": requested,
        "build_s": round(time.perf_counter() - t0, 1),
    }
    doc = {"what": WHAT[args.model], "runs": [out]}
    keep = int(args.keep_gib * (1 << 30))
    per_row = {op for op in args.per_row.split(",") if op}
    out["per_row"] = sorted(per_row)
    for name in requested:
        run_one, batched_at = probes[name]
        if args.solo:
            for width in widths:
                row = solo_check(model, name, width, args.frames, per_row)
                out.setdefault("solo", {}).setdefault(name, {})[str(width)] = row
                print(f"solo {name} width {width}: {row}", flush=True, file=sys.stderr)
                if args.out:
                    write(doc, args.out)
            continue
        reference = run_one()
        for width in widths:
            t0 = time.perf_counter()
            run_batched = batched_at(width)
            with PerRow(per_row, width, weight_storages(model), modules=module_paths(model)):
                batched = run_batched()
            proof = prove_rows(model, run_one, run_batched, width, keep, per_row=per_row)
            row = {
                "end_to_end_first_difference": first_difference(reference, batched),
                **proof.summary(),
                "components": rollup(proof),
                "seconds": round(time.perf_counter() - t0, 1),
            }
            out.setdefault(name, {})[str(width)] = row
            print(
                f"{name} width {width}: end to end differs at {out['unit']} "
                f"{row['end_to_end_first_difference']}, {proof.ops} ops compared, "
                f"{len(proof.broken)} broken ({row['broken_unrepaired']} unrepaired)",
                flush=True,
                file=sys.stderr,
            )
            if args.out:
                write(doc, args.out)
    print(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
