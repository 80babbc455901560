"""The generated 1.0.7 adapter (``stepaudio2_token2wav107``) on the released
minicpmo-utils 1.0.7 code, on CPU: stock ``Token2wav.stream()`` vs the same stream bound
before priming, replayed through the ``FakeGraphBackend`` (``tests/token2wav107_stream.py``,
in a subprocess: 1.0.7 is imported from ``.vendor/`` and must not share a process with the
1.0.6 the other tests import). Every chunk's mel and float32 PCM must be bit-identical,
every call of the three captured callables must be admitted by its catalog (zero misses),
and the estimator carry must keep one address while the stock trim would have moved it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
VENDOR = ROOT / ".vendor" / "minicpmo-utils-1.0.7"
INSTALL = (
    "pip install --no-deps --target .vendor/minicpmo-utils-1.0.7 "
    "-r bench/requirements-token2wav107.txt"
)
if not (VENDOR / "stepaudio2").is_dir():
    pytest.skip(f"minicpmo-utils 1.0.7 is not in {VENDOR}: {INSTALL}", allow_module_level=True)


@pytest.fixture(scope="module")
def run() -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "token2wav107_stream.py")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=3000,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    if "unavailable" in out:
        pytest.skip(f"{out['unavailable']} ({INSTALL})")
    return out


def test_every_chunk_bit_identical(run):
    stock, bound = run["stock"], run["bound"]
    assert len(stock["pcm"]) == len(bound["pcm"]) == 4
    assert bound["mels"] == stock["mels"]
    assert bound["pcm"] == stock["pcm"]


def test_every_call_admitted_by_the_catalog(run):
    calls = run["callables"]
    assert set(calls) == {"flow_chunk", "f0_predictor", "decode"}
    for name, c in calls.items():
        assert c["misses"] == {}, (name, c)
        assert {cls["status"] for cls in c["classes"]} == {"captured"}, (name, c)
    # flow: 302, 352, 402 and the final chunk at 402; vocoder: 4 blocks on the first
    # chunk, 4 on each steady one, 5 on the final one (the last with finalize=True)
    assert {name: c["hits"] for name, c in calls.items()} == {
        "flow_chunk": 4,
        "f0_predictor": 17,
        "decode": 17,
    }
    assert run["fake_replays"] == sum(c["hits"] for c in calls.values())


def test_state_rule_and_device_constants(run):
    # the stock trim would have cut 452 to 402 on the third chunk: the writeback did
    assert run["carry_lengths"] == [352, 402, 402, 402]
    assert run["carry_at_one_address"]
    assert run["solver_workspace"] == [10, 16, 2, 8, 458, 128]
    assert run["constants"]["sine_waves"] == "device buffer"
    assert run["constants"]["stft_window"] == "device buffer"
