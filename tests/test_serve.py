"""Sessions on Ray Serve (runtime/serve): the ray-free parts (affinity table, replica
server, loader, CLI) here on every run; the application itself on a real local Ray
cluster with two replicas, in a pytest process of its own (``serve_cluster_cases.py``;
marked ``ray`` and ``slow``: a cluster costs ~15 s and ~1 GB; skipped with an install
hint without the ``[serve]`` extra).

Every session's outputs through Ray must equal the same session run alone on stock code
(toy_stream.solo_stock), whichever replica holds it and whatever dies beside it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from early_children import EarlyChild, early
from serve_toy import TOY, exact
from toy_stream import x_of

from duplexcadence.runtime.serve import (
    Overloaded,
    ServeConfig,
    ServedModelError,
    SessionLost,
    SessionUnknown,
    load_served_model,
    ray_missing,
)
from duplexcadence.runtime.serve.cli import config_of, parse_args
from duplexcadence.runtime.serve.replica import ReplicaServer
from duplexcadence.runtime.serve.router import Pin, SessionTable, session_id

TESTS = Path(__file__).resolve().parent


# ------------------------------------------------------------------ ray-free
def test_runtime_imports_without_ray():
    code = (
        "import sys; sys.modules['ray'] = None\n"
        "import duplexcadence.runtime, duplexcadence.runtime.serve as s\n"
        "assert s.ray_missing() == s.RAY_HINT, s.ray_missing()\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=TESTS.parent)


def test_table_opens_on_the_most_headroom_and_pins():
    t = SessionTable(replicas=3, capacity=2)
    with pytest.raises(Overloaded, match="0 of 3 replicas up"):
        t.choose()
    t.up(0, "a" * 32)
    t.up(1, "b" * 32)
    placed = []
    for local in range(4):
        i, inc = t.choose()
        placed.append((i, t.opened(i, inc, local)))
    assert [i for i, _ in placed] == [0, 1, 0, 1]
    with pytest.raises(Overloaded, match="4 of 4 session places taken"):
        t.choose()
    assert t.lookup(placed[2][1]).replica == 0 and t.lookup(placed[3][1]).local == 3
    t.close(placed[0][1])
    with pytest.raises(SessionUnknown, match="never opened here, or closed"):
        t.lookup(placed[0][1])
    assert t.choose()[0] == 0  # the freed place
    # a failed open releases its place
    t.opened(0, "a" * 32, None)
    assert t.stats()["replicas"][0]["headroom"] == 1


def test_table_restores_a_lost_session_under_its_id():
    t = SessionTable(replicas=2, capacity=2)
    t.up(0, "a" * 32)
    t.up(1, "b" * 32)
    sid = t.opened(*t.choose(), 7)  # on replica 0
    t.down(0, "a" * 32, "killed")
    i, inc = t.choose()
    assert t.stats()["replicas"][1]["headroom"] == 1  # the restore holds its place
    assert t.opened(i, inc, 3, sid=sid) == sid
    assert t.lookup(sid) == Pin(1, "b" * 32, 3) and t.stats()["lost"] == 0
    t.down(1, "b" * 32, "killed too")
    t.up(0, "c" * 32)
    i, inc = t.choose()
    assert t.opened(i, inc, None, sid=sid) is None  # its replay failed: the place is freed
    assert t.stats()["replicas"][0]["headroom"] == 2
    with pytest.raises(SessionLost, match="killed too"):  # and the session stays lost
        t.lookup(sid)


def test_table_fails_only_the_dead_replicas_sessions():
    t = SessionTable(replicas=2, capacity=4)
    t.up(0, "old0" * 8)
    t.up(1, "one1" * 8)
    s = [t.opened(*t.choose(), k) for k in range(4)]  # 0, 1, 0, 1
    assert t.down(0, "old0" * 8, "killed") == sorted([s[0], s[2]])
    for sid in (s[0], s[2]):
        with pytest.raises(SessionLost, match="replica 0 .* died \\(killed\\)"):
            t.lookup(sid)
    assert t.lookup(s[1]).replica == 1 and t.lookup(s[3]).replica == 1
    assert t.down(0, "old0" * 8, "again") == []  # once
    assert t.choose()[0] == 1  # replica 0 is down until its replacement beats
    t.up(0, "new0" * 8)
    assert t.choose() == (0, "new0" * 8)
    t.close(s[0])  # closing a lost session only forgets it
    with pytest.raises(SessionUnknown):
        t.lookup(s[0])


def test_replica_server_refuses_over_capacity_and_stale_incarnations(monkeypatch):
    monkeypatch.syspath_prepend(str(TESTS))
    r = ReplicaServer(TOY)
    a, b = r.open({"seed": 1}), r.open({"seed": 2})
    with pytest.raises(Overloaded, match="capacity of 2 sessions"):
        r.open({"seed": 3})
    got = [r.step(r.incarnation, a, x_of(1, i)) for i in range(3)]
    r.reset(r.incarnation, a)
    got += [r.step(r.incarnation, a, x_of(1, i)) for i in range(3, 5)]
    assert exact(got, 1, reset_at=(3,))
    with pytest.raises(SessionLost, match="died"):
        r.step("f" * 32, b, x_of(2, 0))
    r.close(r.incarnation, b)
    with pytest.raises(SessionUnknown, match=f"no open session {b}"):
        r.step(r.incarnation, b, x_of(2, 0))
    assert r.headroom() == 1 and r.stats()["refused"] == 1
    assert r.stats()["device_memory"] is None  # a CPU replica has no device count
    with pytest.raises(TypeError, match="mapping of name to value, got list"):
        r.open([("seed", 3)])
    assert r.headroom() == 1  # a refused open holds no place


def test_a_replica_expires_idle_sessions_but_never_one_in_a_call(monkeypatch):
    import dataclasses
    import threading

    monkeypatch.syspath_prepend(str(TESTS))
    r = ReplicaServer(dataclasses.replace(TOY, idle_timeout_s=5.0))
    now = [100.0]
    r.clock = lambda: now[0]
    a, b = r.open({"seed": 1}), r.open({"seed": 2})
    now[0] = 104.0
    got = [r.step(r.incarnation, a, x_of(1, 0))]  # a's last call: 104
    now[0] = 106.0
    assert r.expire_idle() == [b] and r.recently_expired(10.0) == [b]
    assert r.headroom() == 1  # b's place is free
    with pytest.raises(SessionUnknown, match=f"session {b} .* no call for 5 s .*closed"):
        r.step(r.incarnation, b, x_of(2, 0))
    # a call that outlasts the timeout keeps its session: idle counts from its end
    entered, release = threading.Event(), threading.Event()
    step = r.spec.step

    def slow_step(session, x):
        entered.set()
        release.wait(10)
        return step(session, x)

    r.spec = dataclasses.replace(r.spec, step=slow_step)
    th = threading.Thread(target=lambda: got.append(r.step(r.incarnation, a, x_of(1, 1))))
    th.start()
    assert entered.wait(10)
    now[0] = 200.0
    assert r.expire_idle() == []
    release.set()
    th.join(10)
    now[0] = 204.0
    assert r.expire_idle() == [] and exact(got, 1)
    now[0] = 205.5
    assert r.expire_idle() == [a] and r.headroom() == 2
    assert r.recently_expired(10.0) == [a]  # b's expiry is older than 10 s


def test_a_restarted_ingress_adopts_the_sessions_its_replicas_hold():
    first = SessionTable(replicas=1, capacity=3)
    first.up(0, "a" * 32)
    sids = [first.opened(*first.choose(), local) for local in (4, 7)]
    first.down(0, "a" * 32, "killed")  # 4 and 7 are lost to their clients...
    again = SessionTable(replicas=1, capacity=3)  # ...while a fresh table knows nothing
    again.up(0, "b" * 32, open_ids=[4, 7])  # the next incarnation's first beat
    assert again.lookup(session_id("b" * 32, 4)) == Pin(0, "b" * 32, 4)
    assert again.stats()["replicas"][0]["headroom"] == 1  # its places are taken
    # the same ids a restarted ingress meets: what the old table named them
    restarted = SessionTable(replicas=1, capacity=3)
    restarted.up(0, "a" * 32, open_ids=[4, 7])
    assert [restarted.lookup(sid).local for sid in sids] == [4, 7]
    # a session declared lost stays lost even if its replica still reports it
    first.up(0, "a" * 32, open_ids=[4, 7])
    with pytest.raises(SessionLost, match="killed"):
        first.lookup(sids[0])


def test_table_frees_the_places_of_sessions_their_replica_expired():
    t = SessionTable(replicas=2, capacity=1)
    t.up(0, "a" * 32)
    t.up(1, "b" * 32)
    s0, s1 = t.opened(*t.choose(), 4), t.opened(*t.choose(), 9)
    with pytest.raises(Overloaded):
        t.choose()
    assert t.expire(1, "b" * 32, [9, 77], "idle") == [s1]
    assert t.expire(1, "b" * 32, [9], "idle") == []  # a later beat repeats it: once
    assert t.expire(0, "x" * 32, [4], "idle") == []  # another incarnation's ids
    assert t.choose()[0] == 1  # its place is free
    with pytest.raises(SessionUnknown, match=f"session {s1} was closed by replica 1: idle"):
        t.lookup(s1)
    assert t.lookup(s0).local == 4 and t.stats()["expired"] == 1
    t.close(s1)  # closing an expired session only forgets it
    with pytest.raises(SessionUnknown, match="never opened here, or closed"):
        t.lookup(s1)


@pytest.mark.cuda
def test_a_cuda_replica_reports_its_device_memory(monkeypatch):
    import torch

    monkeypatch.syspath_prepend(str(TESTS))
    r = ReplicaServer(TOY, device="cuda")
    sid = r.open({"seed": 1})
    r.step(r.incarnation, sid, x_of(1, 0))
    spike = torch.empty(64 * 2**20, dtype=torch.uint8, device="cuda")
    del spike
    before = r.stats()["device_memory"]
    assert before["peak_mib"] >= before["allocated_mib"] + 64 > 64
    r.reset_peak_memory()
    after = r.stats()["device_memory"]
    assert after["peak_mib"] == after["allocated_mib"] < before["peak_mib"]


def test_served_model_targets_are_checked(monkeypatch):
    monkeypatch.syspath_prepend(str(TESTS))
    assert load_served_model("serve_toy:served").step is not None
    with pytest.raises(ServedModelError, match="not a ServedModel"):
        load_served_model("toy_stream:decl")


def test_cli_builds_the_config():
    args = parse_args(["pkg.contract", "--model", "m:f", "--replicas", "2", "--lanes", "3"])
    c = config_of(args)
    assert (
        config_of(parse_args(["c", "--model", "m:f", "--cpus-per-replica", "7"])).cpus_per_replica
        == 7
    )
    assert (c.contract, c.model, c.replicas, c.lanes, c.device) == (
        "pkg.contract",
        "m:f",
        2,
        3,
        "cpu",
    )
    with pytest.raises(ValueError, match="replicas must be a positive int"):
        ServeConfig("c", "m:f", replicas=0)
    assert c.transport == "actor"
    assert config_of(parse_args(["c", "--model", "m:f", "--transport", "grpc"])).transport == "grpc"
    with pytest.raises(ValueError, match="transport must be one of"):
        ServeConfig("c", "m:f", transport="tcp")
    assert c.restore_calls == 0
    argv = ["c", "--model", "m:f", "--restore-calls", "64"]
    assert config_of(parse_args(argv)).restore_calls == 64
    assert c.idle_timeout_s is None
    argv = ["c", "--model", "m:f", "--idle-timeout-s", "30"]
    assert config_of(parse_args(argv)).idle_timeout_s == 30.0
    for bad in (0, -1.0, True, "30"):
        with pytest.raises(ValueError, match="idle_timeout_s must be None"):
            ServeConfig("c", "m:f", idle_timeout_s=bad)
    for bad in (-1, True, 2.5):
        with pytest.raises(ValueError, match="restore_calls must be 0 \\(off\\) or a positive int"):
            ServeConfig("c", "m:f", restore_calls=bad)


# ------------------------------------------------------------------ real Ray
needs_ray = pytest.mark.skipif(ray_missing() is not None, reason=ray_missing() or "")


@needs_ray
def test_tensor_outputs_leave_the_replica_as_numpy():
    import torch

    from duplexcadence.runtime.serve.app import on_the_wire

    pcm = torch.arange(6, dtype=torch.float32)
    out = on_the_wire(pcm)
    assert isinstance(out, np.ndarray) and np.array_equal(out, pcm.numpy())
    assert isinstance(on_the_wire(pcm.to(torch.bfloat16)), torch.Tensor)
    assert on_the_wire(b"pcm") == b"pcm"


@needs_ray
def test_a_client_refuses_settings_it_does_not_know():
    from duplexcadence.runtime.serve import SessionClient

    with pytest.raises(ValueError, match=r"transport must be one of \('actor', 'grpc'\)"):
        SessionClient("serve_toy", transport="tcp")
    with pytest.raises(ValueError, match="restore_calls must be 0 \\(off\\) or more"):
        SessionClient("serve_toy", restore_calls=-1)
    with pytest.raises(TypeError, match="restore_calls must be an int"):
        SessionClient("serve_toy", restore_calls=8.0)


def test_a_config_from_serve_args_coerces_strings_and_names_what_is_wrong():
    # `serve run ...:app_builder replicas=2` hands every value over as a string
    c = ServeConfig.from_args({"contract": "p.c", "model": "m:f", "replicas": "2", "idle_timeout_s": "30"})  # fmt: skip
    assert (c.replicas, c.idle_timeout_s, c.lanes) == (2, 30.0, 1)
    with pytest.raises(ValueError, match=r"unknown setting\(s\) \['replica'\]; the settings are"):
        ServeConfig.from_args({"contract": "p.c", "model": "m:f", "replica": 2})
    with pytest.raises(ValueError, match="replicas: Input should be a valid integer"):
        ServeConfig.from_args({"contract": "p.c", "model": "m:f", "replicas": "two"})
    with pytest.raises(ValueError, match="model: Field required"):
        ServeConfig.from_args({"contract": "p.c"})
    with pytest.raises(ValueError, match="replicas must be a positive int"):
        ServeConfig.from_args({"contract": "p.c", "model": "m:f", "replicas": "0"})
    with pytest.raises(ValueError, match="args must be a mapping"):
        ServeConfig.from_args(["contract=p.c"])


@needs_ray
def test_the_shipped_serve_config_file_is_valid_and_builds():
    import importlib

    import yaml
    from ray.serve import Application
    from ray.serve.schema import ServeDeploySchema

    path = TESTS.parent / "docs" / "serve_token2wav.yaml"
    schema = ServeDeploySchema.parse_obj(yaml.safe_load(path.read_text()))
    (app,) = schema.applications
    module, _, fn = app.import_path.partition(":")
    built = getattr(importlib.import_module(module), fn)(app.args)
    assert isinstance(built, Application)
    assert app.args["name"] == app.name  # a SessionClient finds the replicas by it
    config = ServeConfig.from_args(app.args)
    assert (config.replicas, config.gpus_per_replica, config.device) == (2, 1.0, "cuda")


CLUSTER_CASES = TESTS / "serve_cluster_cases.py"
# started right after collection (tests/early_children.py): its ~140 s are mostly waiting
CLUSTER_CHILD = EarlyChild(
    [sys.executable, "-m", "pytest", "-q", "-p", "outcome_log", "-p", "no:cacheprovider",
     str(CLUSTER_CASES)],
    {"PYTHONPATH": os.pathsep.join([str(TESTS), *filter(None, [os.environ.get("PYTHONPATH")])])},
    TESTS.parent,
    timeout_s=1200,
)  # fmt: skip
CLUSTER_CHILD.env["OUTCOME_LOG"] = str(CLUSTER_CHILD.dir / "outcomes.jsonl")


@needs_ray
@pytest.mark.ray
@pytest.mark.slow
@early(CLUSTER_CHILD)
def test_the_application_on_a_local_ray_cluster():
    """``serve_cluster_cases.py`` (two replicas, exact sessions, overload, a killed
    replica, WebSocket) in a pytest process of its own: see that file for why. Each case's
    outcome comes back through ``outcome_log`` as it is known, so a failing case is named
    here with its report, and a child that dies early is told apart from one that
    Ray ends after its last case."""
    log = Path(CLUSTER_CHILD.env["OUTCOME_LOG"])
    proc = CLUSTER_CHILD.result()
    shown = f"child pytest exit {proc.returncode}:\n{proc.stdout[-6000:]}\n{proc.stderr[-3000:]}"
    records = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    collected = next((r["collected"] for r in records if "collected" in r), [])
    assert len(collected) >= 6, shown
    failed = [r for r in records if r.get("outcome") not in (None, "passed")]
    assert not failed, "\n\n".join(f"{r['test']} ({r['when']}): {r['report']}" for r in failed)
    passed = {r["test"] for r in records if r.get("when") == "call"}
    assert passed == set(collected), (sorted(set(collected) - passed), shown)
