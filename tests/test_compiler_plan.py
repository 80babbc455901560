"""The capacity plan (compiler/plan.py): what a session, a lane and a voice cost, from
the shipped Token2Wav contract's lifetimes, and the prediction from a profile."""

from __future__ import annotations

from pathlib import Path

import pytest

from duplexcadence.compiler.driver import read_and_compile
from duplexcadence.compiler.plan import Profile, footprint, plan_text, predict

ROOT = Path(__file__).resolve().parents[1]
MIB = 2**20


@pytest.fixture(scope="module")
def token2wav():
    r = read_and_compile(ROOT / "contracts" / "stepaudio2_token2wav.clock", emit=False)
    assert r.ok
    return footprint(r.checked, r.analysis)


def test_sessions_own_turn_regions_lanes_own_the_rest(token2wav):
    owners = {s.name: s.owner for s in token2wav.regions}
    assert owners == {
        "estimator_carry": "session",
        "conformer_carry": "session",
        "estimator_cnn": "session",
        "hift_mel_cache": "session",
        "solver_workspace": "lane",
        "dit_workspace": "lane",
        "dit_cnn": "lane",
    }
    # 10 x 16 x 2 x 8 x 402 x 128 fp32 carry + the conformer carry + the DiT conv state
    assert token2wav.per_session_bytes == pytest.approx(520.7 * MIB, rel=1e-3)
    # a lane holds a copy of every allocated region (1150.7 MiB) plus its staging
    assert token2wav.per_lane_bytes > 1150 * MIB
    # with several lanes the model's sites hold one more set of the site regions
    site_regions = (572.5 + 57.25 + 0.25 + 2.5) * MIB
    assert token2wav.eager_scratch_bytes == pytest.approx(site_regions, rel=1e-3)


def test_prediction_takes_the_smaller_of_memory_and_time(token2wav):
    profile = Profile(
        gpu_bytes=140 * 2**30,
        base_bytes={1: 4 * 2**30, 4: 8 * 2**30},
        chunks_per_s={1: 15.0, 4: 40.0},
    )
    one = predict(token2wav, profile, lanes=1)
    assert one["sessions_by_time"] == 13 and one["limited_by"] == "time"  # 15 x 0.9
    four = predict(token2wav, profile, lanes=4, voices=2)
    assert four["sessions_by_time"] == 36
    free = 140 * 2**30 - 8 * 2**30 - 2 * token2wav.per_voice_bytes
    assert four["sessions_by_memory"] == free // token2wav.per_session_bytes
    tight = Profile(gpu_bytes=16 * 2**30, base_bytes={4: 8 * 2**30}, chunks_per_s={4: 40.0})
    assert predict(token2wav, tight, lanes=4)["limited_by"] == "memory"
    with pytest.raises(KeyError, match="no measurement for 2 lanes"):
        predict(token2wav, profile, lanes=2)


def test_distinct_values_cost_their_graphs_and_their_captures(token2wav):
    profile = Profile(
        gpu_bytes=140 * 2**30,
        base_bytes={8: 12 * 2**30},
        chunks_per_s={8: 36.0},
        graph_bytes_per_value=100 * 2**20,
        capture_s_per_value=2.0,
    )
    one = predict(token2wav, profile, lanes=8)
    many = predict(token2wav, profile, lanes=8, values=36)
    assert many["hold_to_keep_every_value"] == 5 and many["capture_s_for_values"] == 72.0
    assert many["graph_bytes_for_values"] == 36 * 100 * 2**20
    lost = (36 * 100 * 2**20 - 100 * 2**20) // token2wav.per_session_bytes
    assert one["sessions_by_memory"] - many["sessions_by_memory"] in (lost, lost + 1)
    # arriving over 60 s, 72 s of captures are more than one process's eager lock
    crowded = predict(token2wav, profile, lanes=8, values=36, arrivals_s=60.0)
    assert crowded["capture_lock_share"] == 1.2
    assert "captures hold 120% of one process's eager lock" in plan_text(token2wav, [crowded])
    assert "queue behind captures" in plan_text(token2wav, [crowded])
    calm = predict(token2wav, profile, lanes=8, values=36, arrivals_s=144.0)
    assert calm["capture_lock_share"] == 0.5 and "queue" not in plan_text(token2wav, [calm])
    assert many["capture_lock_share"] is None  # no arrival window given
    unmeasured = predict(token2wav, Profile(140 * 2**30, {8: 12 * 2**30}, {8: 36.0}), 8, values=36)
    assert unmeasured["graph_bytes_for_values"] is None
    assert "graphs not in the profile" in plan_text(token2wav, [unmeasured])


def test_clockc_plan_reads_a_profile_and_fails_cleanly(capsys, tmp_path):
    import json

    from duplexcadence.compiler.cli import main

    contract = str(ROOT / "contracts" / "stepaudio2_token2wav.clock")
    profile = ROOT / "bench" / "results" / "profile_token2wav_h200.json"
    assert main(["plan", contract, "--profile", str(profile), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    [entry] = doc["contracts"]
    assert doc["command"] == "plan" and entry["footprint"]["per_session_bytes"] > 0
    assert {p["lanes"] for p in entry["predictions"]} == {1, 8}
    assert main(["plan", contract, "--profile", str(tmp_path / "missing.json")]) == 2
    assert "missing.json" in capsys.readouterr().err
    assert main(["plan", contract, "--profile", str(profile), "--lanes", "3"]) == 2
    assert "no measurement for 3 lanes" in capsys.readouterr().err
    assert main(["plan", contract, "--profile", str(profile), "--arrivals", "0"]) == 2
    assert "--arrivals 0: seconds must be more than 0" in capsys.readouterr().err
