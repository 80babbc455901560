"""The two-fresh-processes form of ``clockc reproduce --processes`` (reproduce.py):
``record_trace`` runs ONE stock copy and writes, per chunk, each operation's module
path, op and a fingerprint of its outputs and the SHA-256 of each output (JSON lines);
``compare_records`` finds the first difference between two such files, as a
``Reproduction``. Allocator history, library handles and lazily chosen algorithms all
start anew in each process: the strongest test of a reference.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import torch

from ..audit import _as_bits, named_leaves
from .op_trace import OpTrace, _host_prints, _state_prints, weight_prints
from .reproduce import OpDifference, Reproduction, _traced, _weights_difference
from .streams import StreamSpec


def record_trace(spec: StreamSpec, chunks: int, path: str | Path, *, trace: bool = True) -> dict:
    """Run one stock copy and write its per-chunk record (module docstring) to ``path``
    (JSON lines: one object per chunk). Returns a summary."""
    model = spec.build()
    tracer = OpTrace(model, keep_bytes=0) if trace else None
    n_ops = 0
    with open(path, "w", encoding="utf-8") as f:
        f.write(json.dumps({"weights": weight_prints(model)}) + "\n")
        try:
            for chunk, item in enumerate(_traced(spec.drive(model, chunks), tracer)):
                ops = tracer.ops if tracer is not None else []
                prints = _host_prints(ops)
                k, rows = 0, []
                for op in ops:
                    shapes = [[list(s) if isinstance(s, tuple) else s, d] for s, d in op.shapes]
                    rows.append([op.module, op.op, shapes, prints[k : k + len(op.prints)]])
                    k += len(op.prints)
                n_ops += len(ops)
                outputs = {p: _digest(v) for p, v in named_leaves(item, "output").items()}
                state = _state_prints(model)
                f.write(json.dumps({"chunk": chunk, "outputs": outputs, "ops": rows,
                                    "state": state}) + "\n")  # fmt: skip
        finally:
            if tracer is not None:
                tracer.remove()
    return {"chunks": chunks, "ops": n_ops}


def _digest(x: Any) -> str:
    if isinstance(x, torch.Tensor):
        t = x.detach().cpu().contiguous()
        head = f"{str(t.dtype)}{tuple(t.shape)}".encode()
        return hashlib.sha256(head + _as_bits(t).numpy().tobytes()).hexdigest()
    return repr(x)


def compare_records(a: str | Path, b: str | Path, device: str = "") -> Reproduction:
    """The first difference between two ``record_trace`` files of the same stream."""
    ra = [json.loads(line) for line in Path(a).read_text(encoding="utf-8").splitlines()]
    rb = [json.loads(line) for line in Path(b).read_text(encoding="utf-8").splitlines()]
    wa, wb = ra.pop(0)["weights"], rb.pop(0)["weights"]
    traced = any(r["ops"] for r in ra)
    result = Reproduction(len(ra), device, traced, mode="processes")
    result.first_difference = _weights_difference(wa, wb)
    for x, y in zip(ra, rb):
        chunk = x["chunk"]
        if result.first_difference is None and traced:
            result.ops_per_chunk.append(len(x["ops"]))
            result.first_difference = _record_difference(chunk, x, y)
            result.state_tensors = len(x["state"])
        differing = next((p for p in x["outputs"] if x["outputs"][p] != y["outputs"].get(p)), None)
        if differing is not None or list(x["outputs"]) != list(y["outputs"]):
            result.output_divergence = {"chunk": chunk, "output": differing or "structure",
                                        "note": "SHA-256 differs"}  # fmt: skip
            break
        result.compared = chunk + 1
    if len(ra) != len(rb) and result.output_divergence is None:
        result.output_divergence = {"chunk": min(len(ra), len(rb)), "output": "stream",
                                    "note": f"{len(ra)} vs {len(rb)} chunks recorded"}  # fmt: skip
    return result


def _record_difference(chunk: int, x: dict, y: dict) -> OpDifference | None:
    for i, (p, q) in enumerate(zip(x["ops"], y["ops"])):
        if p[:3] != q[:3]:
            return OpDifference(chunk, "control", i, q[0], q[1],
                                note=f"copy A ran {p[1]} {p[2]} in {p[0] or '<top>'}")  # fmt: skip
        for leaf, (fa, fb) in enumerate(zip(p[3], q[3])):
            if fa != fb:
                return OpDifference(
                    chunk, "op", i, p[0], p[1], leaf, tuple(p[2][leaf][0]), p[2][leaf][1],
                    note="fingerprints differ (values are not recorded across processes; "
                    "`clockc reproduce` without --processes shows them when two copies in "
                    "one process part too)",
                )  # fmt: skip
    if len(x["ops"]) != len(y["ops"]):
        return OpDifference(chunk, "control", min(len(x["ops"]), len(y["ops"])), "", "",
                            note=f"{len(x['ops'])} vs {len(y['ops'])} ops")  # fmt: skip
    for path, d in x["state"].items():
        if y["state"].get(path) != d:
            return OpDifference(chunk, "state", None, path, "", note="fingerprints differ")
    return None


__all__ = ["compare_records", "record_trace"]
