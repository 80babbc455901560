"""Token2Wav sessions (bench/sessions_token2wav.py) on the CPU: two sessions on two lanes
of the serving contract, interleaved, across a turn reset, each equal to the same
session alone on stock code (the real released decoder: minutes on two cores)."""

from __future__ import annotations

import hashlib

import pytest
import torch

from bench.workloads import token2wav as W

pytestmark = pytest.mark.slow

_REASON = W.unavailable_reason()
if _REASON is not None:
    pytest.skip(_REASON, allow_module_level=True)

from bench.cadence import Arm, TraceSettings, trace  # noqa: E402
from bench.sessions_token2wav import SESSIONS, AdapterServer, StockServer  # noqa: E402
from memory import release_freed_memory  # noqa: E402

# two turns of two chunks each, the second turn re-primed (a reset)
SETTINGS = TraceSettings(
    duration_s=5.5, ramp_s=0.0, turn_chunks=(2, 2), silence_s=(0.5, 0.5), p_reset=1.0
)


def _feed(server, s, chunk, digest) -> None:
    if chunk.reset:
        server.reset(s)
    digest.update(server.submit(s, chunk)["pcm"].tobytes())


def _solo_stock_digests(specs, device) -> list[str]:
    """Each session alone on stock code. A function of its own: its locals (the server,
    the last session, which holds the model) are gone when it returns, so the stock
    model's GBs are freed before the adapter's are allocated (measured: 4.1 GiB still
    held when the server alone was deleted, a 10 GiB peak; the suite's highest)."""
    stock = StockServer(SESSIONS.arm("stock_procs"), device)
    want = []
    for sp in specs:
        d, s = hashlib.sha256(), stock.open(sp)
        for c in sp.chunks:
            _feed(stock, s, c, d)
        want.append(d.hexdigest())
    return want


def test_interleaved_sessions_on_two_lanes_equal_solo_stock():
    specs = trace(SETTINGS, 2)
    assert all(sp.turns == 2 for sp in specs)
    cpu = torch.device("cpu")
    want = _solo_stock_digests(specs, cpu)
    release_freed_memory()
    adapter = AdapterServer(
        # the default trace's voices are the vendor's 302-frame prompt: lanes for it only
        Arm("two", "inproc", "", {"adapter": True, "lanes": 2, "params_up_to": {"f_prompt": 302}}),
        cpu,
    )
    sessions = [adapter.open(sp) for sp in specs]
    digests = [hashlib.sha256() for _ in specs]
    for i in range(len(specs[0].chunks)):
        for j in (0, 1) if i % 2 else (1, 0):
            _feed(adapter, sessions[j], specs[j].chunks[i], digests[j])
    assert [d.hexdigest() for d in digests] == want
    st = adapter.stats()["sessions"]
    assert st["lanes"] == 2 and st["runs"] >= 2 * len(specs[0].chunks)
