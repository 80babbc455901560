"""reproduce.py / `clockc reproduce`: does a stock stream reproduce itself, and where
do two copies part? (issue 21: a reference must be shown to reproduce first)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

import tiny_stream_model as T
import unsteady_model as U
from duplexcadence.runtime.tools.op_trace import fingerprint, state_tensors
from duplexcadence.runtime.tools.reproduce import reproduce_stream
from duplexcadence.runtime.tools.reproduce_records import compare_records, record_trace

TESTS = Path(__file__).parent


def test_a_steady_model_reproduces_op_for_op():
    r = reproduce_stream(T.stream(), 5)
    assert r.reproducible, r.describe()
    assert r.compared == 5 and len(r.ops_per_chunk) == 5 and min(r.ops_per_chunk) > 20
    assert r.state_tensors >= 3  # the conv cache and the two KV tensors at model.cache
    assert "reference reproducible" in r.describe()


def test_the_first_differing_op_is_named_with_both_values():
    r = reproduce_stream(U.stream(), 5)
    assert not r.reproducible
    d = r.first_difference
    assert (d.kind, d.chunk, d.module) == ("op", U.AT, "nudge")
    # the plant's first op whose bytes differ: the mask element it sets (False vs True)
    assert d.count == 1 and (d.first, d.second) == (False, True)
    assert d.dtype == "bool" and d.op.startswith("aten.")
    # what a user sees: the output of the same chunk
    assert r.output_divergence["chunk"] == U.AT
    text = r.describe()
    assert "NOT reproducible" in text and "nudge" in text and f"chunk {U.AT}" in text


def test_state_that_no_output_reads_is_compared_too():
    # traced, the op that writes it differs first; untraced, the state after the chunk
    traced = reproduce_stream(U.state_stream(), 5).first_difference
    assert (traced.kind, traced.chunk, traced.op) == ("op", U.AT, "aten.add_.Tensor")
    r = reproduce_stream(U.state_stream(), 5, trace=False)
    assert r.output_divergence is None and r.compared == 5
    d = r.first_difference
    assert (d.kind, d.chunk, d.module) == ("state", U.AT, "scratch")
    assert not r.reproducible and "state differs" in r.describe()


def test_traced_from_a_late_chunk_the_same_op_is_found():
    r = reproduce_stream(U.stream(), 5, trace_from=U.AT)
    d = r.first_difference
    assert (d.kind, d.chunk, d.module) == ("op", U.AT, "nudge") and r.traced_from == U.AT
    assert len(r.ops_per_chunk) == 1  # only the chunk it traced
    assert f"ops traced from chunk {U.AT}" in r.describe()


def test_a_difference_before_the_traced_chunks_is_found_in_the_state():
    d = reproduce_stream(U.state_stream(), 5, trace_from=U.AT + 1).first_difference
    assert (d.kind, d.chunk, d.module) == ("state", U.AT, "scratch")


def test_outputs_only_without_the_trace():
    r = reproduce_stream(U.stream(), 5, trace=False)
    assert r.ops_per_chunk == [] and r.output_divergence["chunk"] == U.AT


def test_records_of_two_runs_compare_by_fingerprint(tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    record_trace(T.stream(), 3, a)
    record_trace(T.stream(), 3, b)
    assert compare_records(a, b).reproducible
    # the second unsteady copy of this process (the first one was built just now)
    record_trace(U.stream(), 4, a)
    record_trace(U.stream(), 4, b)
    r = compare_records(a, b)
    d = r.first_difference
    assert not r.reproducible and (d.kind, d.chunk, d.module) == ("op", U.AT, "nudge")
    assert r.output_divergence["chunk"] == U.AT


def test_fingerprints_tell_bit_patterns_apart():
    x = torch.tensor([0.0, 1.0, 2.0])
    assert torch.equal(fingerprint(x), fingerprint(x.clone()))
    assert not torch.equal(fingerprint(x), fingerprint(torch.tensor([-0.0, 1.0, 2.0])))
    assert not torch.equal(fingerprint(x), fingerprint(torch.tensor([1.0, 0.0, 2.0])))
    assert fingerprint(torch.tensor([True, False])).shape == (2,)


def test_state_tensors_walk_module_state_objects():
    class Ring:
        def __init__(self):
            self.cache = torch.zeros(2)

    m = torch.nn.Linear(2, 2)
    m._streaming_state = {"ring": Ring(), "offset": torch.zeros(1)}
    found = state_tensors(m)
    assert set(found) == {"_streaming_state['ring'].cache", "_streaming_state['offset']"}


def _clockc(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "duplexcadence.compiler.cli", *args],
        cwd=TESTS,
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
    )


def test_clockc_reproduce_in_fresh_processes(tmp_path):
    ok = _clockc("reproduce", "--stream", "tiny_stream_model:stream", "--chunks", "3",
                 "--processes")  # fmt: skip
    assert ok.returncode == 0, ok.stderr
    assert "in fresh processes" in ok.stdout and "reproducible" in ok.stdout
    mark = {"UNSTEADY_MARK": str(tmp_path / "mark")}
    bad = _clockc("reproduce", "--stream", "unsteady_model:stream", "--chunks", "4",
                  "--processes", "--format", "json", env=mark)  # fmt: skip
    assert bad.returncode == 1, bad.stderr
    doc = json.loads(bad.stdout)
    entry = doc["contracts"][0] if "contracts" in doc else doc["entries"][0]
    assert entry["reproducible"] is False
    assert entry["first_difference"]["module"] == "nudge"
    assert entry["first_difference"]["chunk"] == U.AT


def test_clockc_reproduce_usage_errors():
    r = _clockc("reproduce", "--stream", "no_such_module:stream")
    assert r.returncode == 2 and "no_such_module" in r.stderr and "Traceback" not in r.stderr
    r = _clockc("reproduce", "--stream", "tiny_stream_model:stream", "--chunks", "0")
    assert r.returncode == 2 and "--chunks" in r.stderr
    r = _clockc("reproduce", "--stream", "tiny_stream_model:stream", "--trace-from", "20")
    assert r.returncode == 2 and "--trace-from must be in 0..19" in r.stderr
    r = _clockc("reproduce", "--stream", "tiny_stream_model:stream", "--trace-from", "2",
                "--processes")  # fmt: skip
    assert r.returncode == 2 and "not with --processes" in r.stderr


def test_verify_refuses_a_reference_that_does_not_reproduce():
    from duplexcadence.runtime.tools.verify import verify_stream

    adapter = T.adapter()
    verdict = verify_stream(adapter.bind, U.stream(), 5, reference_check=True)
    assert not verdict.ok
    assert verdict.divergence.kind == "reference" and verdict.divergence.chunk == U.AT
    assert "STOCK copies already differ" in verdict.describe()
    good = verify_stream(adapter.bind, T.stream(), 5, reference_check=True)
    assert good.ok and "reference: two stock copies reproduce" in good.describe()
