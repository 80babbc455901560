"""Moshi sessions in lockstep (bench/sessions_moshi.py ``LockstepSessions``), tiny LM on
CPU: the adapter bound at batch=8 on the vendor's batched streaming state, sessions on
their own threads opening at different times, sitting ticks out and taking over the
row of a session that closed; each session's token IDs and PCM equal its solo run on
the unbound stock model. (The tiny random LM answers every input alike, so what this
pins is each row's position: a row that ran a parked tick, or kept a closed session's
state, would be a frame off.)"""

from __future__ import annotations

import dataclasses
import hashlib
import threading
import time

import pytest
import torch

from bench.workloads import moshi as W

pytestmark = pytest.mark.slow

_REASON = W.unavailable_reason()
if _REASON is not None:
    pytest.skip(_REASON, allow_module_level=True)

from bench.cadence import TraceSettings, trace  # noqa: E402
from bench.sessions_moshi import SESSIONS, LockstepSessions, StockSolo  # noqa: E402

SETTINGS = TraceSettings(duration_s=0.56, period_s=0.08, ramp_s=0.0, turn_chunks=(99, 99))


@pytest.fixture(autouse=True)
def _no_vendor_graphs(monkeypatch):
    monkeypatch.setenv("NO_CUDA_GRAPH", "1")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _serve(server, spec, digests, outputs, wait=None, pause_at=None, done=None) -> None:
    if wait is not None:
        wait.wait()
    d, n = hashlib.sha256(), 0
    s = server.open(spec)
    for c in spec.chunks:
        if c.seq == pause_at:
            time.sleep(1.0)  # the other sessions go on without this one
        out = server.submit(s, c)
        for v in out.values():
            if v is not None:
                d.update(v.numpy().tobytes())
                n += 1
    server.close(s)
    digests[spec.index], outputs[spec.index] = d.hexdigest(), n
    if done is not None:
        done.set()


def test_lockstep_sessions_equal_solo_stock_whatever_joins_when():
    a, b, c = trace(SETTINGS, 3)
    a = dataclasses.replace(a, chunks=a.chunks[:3])  # closes early: c reuses its row
    specs = (a, b, c)
    stock = StockSolo(SESSIONS.arm("stock_solo"), torch.device("cpu"), W.TINY_LM_KWARGS)
    want, counts = {}, {}
    for sp in specs:
        _serve(stock, sp, want, counts)
    batched = LockstepSessions(SESSIONS.arm("moshi_batch8"), torch.device("cpu"), W.TINY_LM_KWARGS)
    got, got_counts = {}, {}
    a_closed = threading.Event()
    threads = [
        threading.Thread(target=_serve, args=(batched, a, got, got_counts, None, None, a_closed)),
        threading.Thread(target=_serve, args=(batched, b, got, got_counts, None, 2)),
        threading.Thread(target=_serve, args=(batched, c, got, got_counts, a_closed)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert got_counts == counts and min(counts.values()) > 0  # outputs once the delay passed
    assert got == want
    lockstep = batched.stats()["lockstep"]
    assert lockstep["width"] == 8 and lockstep["rows"] == sum(len(sp.chunks) for sp in specs)
    assert lockstep["opened"] == 3 and lockstep["parked"] > 5 * lockstep["ticks"]
    assert batched.pool.stats()["open"] == 0


def test_chunks_sent_ahead_equal_solo_stock_and_are_timed_by_their_tick():
    # the cadence client sends each chunk at its arrival time without waiting for the
    # last one's output (LockstepSessions.send / receive): one session starts a second
    # late, so its first chunks are all in at once and queue; every session's hashes
    # still equal its solo stock run, and each latency runs to the end of its tick
    from bench.cadence.serve import Client

    a, b = trace(SETTINGS, 2)
    stock = StockSolo(SESSIONS.arm("stock_solo"), torch.device("cpu"), W.TINY_LM_KWARGS)
    want = {}
    for sp in (a, b):
        ref = Client(stock, sp, SESSIONS.streams, time.perf_counter())
        ref.serve(paced=False)
        want[sp.index] = ref.hashes.record()
    batched = LockstepSessions(SESSIONS.arm("moshi_batch8"), torch.device("cpu"), W.TINY_LM_KWARGS)
    t0 = time.perf_counter()
    clients = [
        Client(batched, a, SESSIONS.streams, t0),
        Client(batched, b, SESSIONS.streams, t0 - 1.0),
    ]
    threads = [threading.Thread(target=c.serve) for c in clients]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert [c.error for c in clients] == [None, None]
    assert {c.spec.index: c.hashes.record() for c in clients} == want
    late = [row[4] for row in clients[1].rows]
    assert len(late) == len(b.chunks) and late[0] > 1000.0  # sent a second late, counted
    assert batched.pool.stats()["open"] == 0


def test_the_contracts_rows_are_proven_on_the_vendor_code_and_a_proof_without_them_is_refused(
    monkeypatch,
):
    # prove_lockstep on the released Moshi (tiny LM, CPU): with contracts/moshi.clock's
    # rows every callable's row 0 equals batch 1, op by op, and bind admits the proof;
    # without the rows the proof names Mimi's convolutions and codebook distances
    from bench.sessions_moshi import prove_at_width
    from duplexcadence.runtime import LockstepNotProven
    from duplexcadence.runtime.serving.declared import BatchDecl

    def pair():
        return W.build_moshi(0, torch.device("cpu"), lm_kwargs=W.TINY_LM_KWARGS, start=False)

    mimi, lm_gen = pair()
    proof = prove_at_width(mimi, lm_gen, 8, 2)
    assert proof.proven, proof.summary()
    assert proof.callables["mimi_encode"].rows[-1] == "aten._euclidean_dist.default"
    W.start_streaming(mimi, lm_gen, 8)
    binding = W.bind_adapter(mimi, lm_gen, torch.device("cpu"), batch=8, proof=proof)
    assert "lockstep proof: width 8 proven on cpu" in binding.report()
    binding.unbind()

    monkeypatch.setattr(BatchDecl, "row_ops", lambda self: {})
    monkeypatch.setattr(BatchDecl, "rows_shown", lambda self: [])
    mimi, lm_gen = pair()
    unproven = prove_at_width(mimi, lm_gen, 8, 2)
    broken = unproven.callables["mimi_encode"].broken
    assert any(op.startswith("aten.convolution.default in mimi.") for op in broken)
    assert "aten._euclidean_dist.default in <top>" in broken
    W.start_streaming(mimi, lm_gen, 8)
    with pytest.raises(LockstepNotProven, match="'mimi_decode' is not proven"):
        W.bind_adapter(mimi, lm_gen, torch.device("cpu"), batch=8, proof=unproven)


def test_lockstep_ticks_proves_other_rows_before_timing_them(monkeypatch, tmp_path):
    # bench.lockstep_ticks --rows: rows that do not hold at the width are refused at bind
    # with the ops that broke, never timed (an equal outputs_sha256 over a few ticks is
    # no evidence: on the H100 gating-only rows matched it and sessions diverged)
    import json

    from bench import lockstep_ticks
    from duplexcadence.runtime.serving.declared import BatchDecl

    monkeypatch.setattr(BatchDecl, "row_ops", BatchDecl.row_ops)  # --rows patches it
    out = tmp_path / "ticks.json"
    argv = ["--width", "8", "--ticks", "1", "--warmup", "1", "--tiny-cpu", "--out", str(out)]
    assert lockstep_ticks.main([*argv, "--rows", "mimi_encode=aten.mm.default"]) == 0
    (row,) = json.loads(out.read_text())["rows"]
    assert row["proven"] is False and "tick_ms_p50" not in row
    assert "'mimi_encode' is not proven" in row["refused"]
    assert "aten.convolution.default in mimi." in row["refused"]


def test_an_audited_pool_follows_a_session_with_a_batch1_shadow_and_finds_it_exact():
    # the proven arm with its run-time audit: the shadow (a copy of the pair sharing its
    # weights, batch 1, eager) follows the first session and checks every frame it got
    a, b = trace(SETTINGS, 2)
    stock = StockSolo(SESSIONS.arm("stock_solo"), torch.device("cpu"), W.TINY_LM_KWARGS)
    want, counts = {}, {}
    for sp in (a, b):
        _serve(stock, sp, want, counts)
    batched = LockstepSessions(
        SESSIONS.arm("moshi_batch8_audited"), torch.device("cpu"), W.TINY_LM_KWARGS
    )
    shadow_weight = batched.pool.auditor.audit.step.__self__.lm_gen.lm_model.text_emb.weight
    assert shadow_weight is batched.lm_gen.lm_model.text_emb.weight  # shared, not copied
    got, got_counts = {}, {}
    threads = [
        threading.Thread(target=_serve, args=(batched, sp, got, got_counts)) for sp in (a, b)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert got == want and got_counts == counts
    audit = batched.stats()["lockstep"]["audit"]
    assert audit["followed"] == 1 and audit["checks"] == len(a.chunks)
    assert audit["divergences"] == audit["shadow_errors"] == audit["stopped_behind"] == 0
