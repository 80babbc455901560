"""Moshi sessions on one binding (bench/workloads/moshi_sessions.py), tiny LM on CPU:
the stream state lives in the vendor's modules and is swapped in place around every
step; interleaved sessions each equal their solo run on the unbound stock model."""

from __future__ import annotations

import os

import pytest
import torch

from bench.workloads import moshi as W

pytestmark = pytest.mark.slow

_REASON = W.unavailable_reason()
if _REASON is not None:
    pytest.skip(_REASON, allow_module_level=True)

from bench.workloads.moshi_sessions import MoshiAdapterServer, solo_stock  # noqa: E402

SEED, N = 3, 5


@pytest.fixture(autouse=True)
def _no_vendor_graphs(monkeypatch):
    monkeypatch.setenv("NO_CUDA_GRAPH", "1")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_interleaved_moshi_sessions_equal_solo_stock():
    mimi, lm_gen = W.build_moshi(SEED, "cpu", torch.bfloat16, W.TINY_LM_KWARGS, greedy=True)
    seeds = (11, 12, 13)
    want = {s: solo_stock(mimi, lm_gen, s, N) for s in seeds}
    server = MoshiAdapterServer(mimi, lm_gen, "cpu")
    sessions = {s: server.open(s, N) for s in seeds}
    for i in range(N):
        for s in (seeds if i % 2 else seeds[::-1]):
            server.frame(sessions[s])
    assert {s: sessions[s].digest.hexdigest() for s in seeds} == want
    # (the tiny random LM answers these inputs alike; what this pins is the state swap:
    # leaving out the LM transformer's own states, which LMGen.get_streaming_state()
    # does not list, makes interleaved sessions differ from their solo runs)
    stats = server.pool.stats()
    assert stats["runs"] == len(seeds) * (N + 1) and stats["session_bytes"] > 0
    assert os.environ["NO_CUDA_GRAPH"] == "1"
