"""The Serve application on a real local Ray cluster with two replicas. Not collected
by a plain ``pytest`` run (the name): ``tests/test_serve.py`` runs this file in a pytest
process of its own, because the Ray driver must not share the suite's process. Ray's
core worker ends a process that touches it after ``ray.shutdown()`` at once, with exit
status 1 and no output (ray-project/ray#19115), and Serve's router thread outlives the
shutdown; in the suite's process that would end every later test. Run it directly for
the per-test view: ``python -m pytest tests/serve_cluster_cases.py``.

Every session's outputs through Ray must equal the same session run alone on stock code
(toy_stream.solo_stock), whichever replica holds it and whatever dies beside it."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest

from serve_toy import TOY, exact
from toy_stream import x_of

from duplexcadence.runtime.serve import (
    Overloaded,
    SessionLost,
    SessionUnknown,
    ray_missing,
)

if ray_missing() is not None:
    pytest.skip(ray_missing(), allow_module_level=True)

TESTS = Path(__file__).resolve().parent
HTTP: dict = {}  # the fixture's WebSocket port


@pytest.fixture(scope="module")
def app():
    import ray

    from duplexcadence.runtime.serve.launch import init_local, start

    init_local(
        num_cpus=2, object_store_mib=80, paths=(TESTS,), shared_host=True, log_to_driver=False
    )
    HTTP["port"] = _free_port()
    try:
        yield start(TOY, http_port=HTTP["port"])
    finally:
        ray.shutdown()  # takes Serve with it (serve.shutdown() waits ~20 s more)


@pytest.fixture(scope="module")
def client(app):
    from duplexcadence.runtime.serve import SessionClient

    c = SessionClient(TOY.name)
    try:
        yield c
    finally:
        c.shutdown()
        assert not c.following  # no thread of ours calls into Ray after ray.shutdown()


class ViaIngress:
    """The ingress handle, as a SessionClient's methods (every chunk: two hops)."""

    def __init__(self, handle) -> None:
        self.handle = handle

    def open(self, params: dict) -> str:
        return self.handle.open.remote(params).result()

    def chunk(self, sid: str, x):
        return self.handle.chunk.remote(sid, x).result()

    def reset(self, sid: str) -> None:
        self.handle.reset.remote(sid).result()

    def close(self, sid: str) -> None:
        self.handle.close.remote(sid).result()


@pytest.fixture(scope="module")
def grpc_client(app):
    from duplexcadence.runtime.serve import SessionClient

    c = SessionClient(TOY.name, transport="grpc")
    try:
        yield c
    finally:
        c.shutdown()
        assert not c.following


@pytest.fixture(params=["ingress", "client", "grpc_client"])
def via(request, app):
    """How a test's sessions are driven: the ingress handle, or a SessionClient (chunks
    straight to the pinned replica, by Ray actor call or by Serve's gRPC transport)."""
    return ViaIngress(app) if request.param == "ingress" else request.getfixturevalue(request.param)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _replicas(handle) -> list[dict]:
    return handle.stats.remote().result()["replicas"]


def _kill(app_name: str, deployment: str) -> None:
    """Kill the actor of ``deployment`` (``replica_0``, ``Ingress``) of an application.
    ``ray.kill`` returns before the actor is gone: a call right after may be answered."""
    import ray

    victim = next(
        a["name"]
        for a in ray.util.list_named_actors(all_namespaces=True)
        if f"{app_name}#{deployment}#" in a["name"]
    )
    ray.kill(ray.get_actor(victim, namespace="serve"), no_restart=True)


def _wait_all_up(handle, timeout_s: float = 60.0) -> list[dict]:
    t = time.time()
    while time.time() - t < timeout_s:
        rs = _replicas(handle)
        if all(r["up"] for r in rs):
            return rs
        time.sleep(0.2)
    raise AssertionError(f"replicas not up in {timeout_s} s: {rs}")


def test_sessions_on_two_replicas_equal_their_solo_stock_runs(app, via):
    _wait_all_up(app)
    seeds = (1, 2, 3, 4)
    sids = {s: via.open({"seed": s}) for s in seeds}
    got: dict[int, list] = {s: [] for s in seeds}
    errors: list[BaseException] = []

    def client(s: int) -> None:
        try:
            for i in range(6):
                if i == 4:
                    via.reset(sids[s])
                got[s].append(via.chunk(sids[s], x_of(s, i)))
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=client, args=(s,)) for s in seeds]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    assert not errors
    for s in seeds:
        assert exact(got[s], s, reset_at=(4,)), f"session {s} differs"
    rs = _replicas(app)
    assert [r["open"] for r in rs] == [2, 2]  # least loaded first: both replicas serve
    assert all(r["server"]["pool"]["runs"] >= 12 for r in rs)
    for sid in sids.values():
        via.close(sid)
    with pytest.raises(SessionUnknown, match="never opened here, or closed"):
        via.chunk(sids[1], x_of(1, 6))
    with pytest.raises(SessionUnknown):
        via.chunk("no-such-session", x_of(1, 0))


def test_client_steps_a_session_opened_through_the_ingress(app, client):
    _wait_all_up(app)
    sid = app.open.remote({"seed": 7}).result()
    got = [client.chunk(sid, x_of(7, 0)), app.chunk.remote(sid, x_of(7, 1)).result()]
    client.reset(sid)
    got.append(client.chunk(sid, x_of(7, 2)))
    assert exact(got, 7, reset_at=(2,))
    app.close.remote(sid).result()  # closed elsewhere: the client's pin is refused there
    with pytest.raises(SessionUnknown, match="no open session"):
        client.chunk(sid, x_of(7, 3))


def test_overload_is_refused_at_open(app, client):
    _wait_all_up(app)
    sids = [app.open.remote({"seed": s}).result() for s in range(4)]  # 2 replicas x 2
    with pytest.raises(Overloaded, match="4 of 4 session places taken"):
        app.open.remote({"seed": 9}).result()
    with pytest.raises(Overloaded, match="4 of 4 session places taken"):
        client.open({"seed": 9})
    # the open sessions are unaffected, and a closed place can be taken again
    assert exact([app.chunk.remote(sids[3], x_of(3, 0)).result()], 3)
    app.close.remote(sids[0]).result()
    sids[0] = app.open.remote({"seed": 0}).result()
    for sid in sids:
        app.close.remote(sid).result()


def test_a_dead_replica_fails_its_sessions_within_2s_and_is_replaced(app, via):
    rs = _wait_all_up(app)
    seeds = (11, 12, 13, 14)
    sids = {s: via.open({"seed": s}) for s in seeds}
    pins = {s: int(sids[s].split("-")[1] == rs[1]["incarnation"][:8]) for s in seeds}
    assert sorted(pins.values()) == [0, 0, 1, 1]
    got: dict[int, list] = {s: [] for s in seeds}
    failed: dict[int, tuple[float, BaseException]] = {}
    killed_at: list[float] = []

    def client(s: int) -> None:  # a real-time client: one chunk every 50 ms
        for i in range(60):
            try:
                got[s].append(via.chunk(sids[s], x_of(s, i)))
            except BaseException as e:  # noqa: BLE001 - checked below
                failed[s] = (time.time(), e)
                return
            time.sleep(0.05)

    threads = [threading.Thread(target=client, args=(s,)) for s in seeds]
    for th in threads:
        th.start()
    time.sleep(0.6)
    killed_at.append(time.time())
    _kill(TOY.name, "replica_0")
    for th in threads:
        th.join(60)
    dead = {s for s in seeds if pins[s] == 0}
    assert set(failed) == dead, {s: repr(e) for s, (_, e) in failed.items()}
    for s in dead:
        at, e = failed[s]
        assert isinstance(e, SessionLost) and "replica 0" in str(e)
        assert (
            at - killed_at[0] < 2.0
        ), f"session {s} learned of the death after {at - killed_at[0]:.2f} s"
        assert exact(got[s], s)  # every chunk it did get was right
        with pytest.raises(SessionLost):
            via.chunk(sids[s], x_of(s, 0))
        via.close(sids[s])
    for s in set(seeds) - dead:  # untouched: every chunk, every byte
        assert len(got[s]) == 60 and exact(got[s], s)
        via.close(sids[s])
    # Serve replaces the replica; it comes up under a new incarnation and takes sessions
    after = _wait_all_up(app, timeout_s=90)
    assert after[0]["incarnation"] != rs[0]["incarnation"]
    assert after[1]["incarnation"] == rs[1]["incarnation"]
    fresh = [via.open({"seed": s}) for s in (21, 22)]
    assert {f.split("-")[1] for f in fresh} == {r["incarnation"][:8] for r in after}
    for f, s in zip(fresh, (21, 22)):  # on the replacement and on the survivor
        assert exact([via.chunk(f, x_of(s, 0))], s)
    for f in fresh:
        via.close(f)


def test_restored_sessions_go_on_byte_for_byte_after_their_replica_dies(app):
    """``restore_calls``: a session whose replica dies is rebuilt on the survivor from
    its calls — kept by the ingress for a session it steps (``ServeConfig``), by the
    client for one it steps (``SessionClient``) — and goes on byte for byte as its solo
    stock run, reset included; one with a longer history is lost, saying so; the
    survivor's own sessions are untouched."""
    import dataclasses

    from ray import serve

    from duplexcadence.runtime.serve import SessionClient
    from duplexcadence.runtime.serve.launch import start

    limit = 40
    config = dataclasses.replace(TOY, name="serve_toy_restore", max_sessions=4, restore_calls=limit)
    rapp = start(config, route_prefix="/restore")
    rs = _wait_all_up(rapp)
    via = ViaIngress(rapp)
    with SessionClient(config.name, restore_calls=limit) as c:
        # least loaded first, ties to the lower index: 51, 53, 55 on replica 0
        sids = {51: via.open({"seed": 51})}
        for s in (52, 53, 54, 55):
            sids[s] = c.open({"seed": s})
        on = {s: sids[s].split("-")[1] == rs[0]["incarnation"][:8] for s in sids}
        assert [s for s in sids if on[s]] == [51, 53, 55]
        driver = {51: via, 52: c, 53: c, 54: c, 55: c}
        got: dict[int, list] = {s: [] for s in sids}

        def step(s: int) -> None:
            got[s].append(driver[s].chunk(sids[s], x_of(s, len(got[s]))))

        for s in (51, 53):  # two chunks, a reset (journaled too), a chunk
            step(s)
            step(s)
            driver[s].reset(sids[s])
            step(s)
        for _ in range(limit + 5):  # 55: more calls than a restore replays
            step(55)
        step(52)
        _kill(config.name, "replica_0")
        lost, t = None, time.time()
        while lost is None and time.time() - t < 10:  # until the death is known
            try:
                step(55)
            except SessionLost as e:
                lost = str(e)
            for s in (51, 52, 53):
                step(s)
            time.sleep(0.05)
        assert lost is not None and f"more than the {limit} a restore replays" in lost, lost
        for _ in range(3):  # after the restores, on the survivor
            for s in (51, 52, 53):
                step(s)
        for s in (51, 53):
            assert exact(got[s], s, reset_at=(2,)), s
        assert exact(got[52], 52) and exact(got[55], 55)
        stats = c.stats()
        restores = stats["restores"]
        assert restores["replay_s"] > 0 and restores["journals"] == 1  # 51's, at the ingress
        assert restores["journal_bytes"] > 0
        assert {k: restores[k] for k in ("restored", "not_restored", "calls_replayed")} == {
            "restored": 2,
            "not_restored": 1,
            "calls_replayed": 8,
        }
        assert stats["replicas"][1]["open"] == 4  # 51-54 on the survivor
        with pytest.raises(SessionLost, match="a restore replays"):  # lost for good
            c.chunk(sids[55], x_of(55, 0))
        assert c.journal_bytes > 0
        for s, sid in sids.items():
            driver[s].close(sid)
        assert c.journal_bytes == 0 and c.stats()["restores"]["journals"] == 0
        assert c.stats()["open"] == 0 and c.stats()["lost"] == 0
    serve.delete(config.name)


def test_sessions_without_calls_expire_and_free_their_places(app):
    """``idle_timeout_s``: a session nobody calls (its client vanished) is closed by its
    replica and its place freed at the ingress; a late call is told why, a late close
    is no error, and a session that keeps calling is untouched."""
    import dataclasses

    from ray import serve

    from duplexcadence.runtime.serve import SessionClient
    from duplexcadence.runtime.serve.launch import start

    config = dataclasses.replace(TOY, name="serve_toy_idle", idle_timeout_s=1.0)
    iapp = start(config, route_prefix="/idle")
    _wait_all_up(iapp)
    via = ViaIngress(iapp)
    with SessionClient(config.name) as c:
        quiet = {61: via.open({"seed": 61}), 62: c.open({"seed": 62})}
        busy = c.open({"seed": 63})
        got = [c.chunk(busy, x_of(63, 0))]
        for s, sid in quiet.items():
            (via if s == 61 else c).chunk(sid, x_of(s, 0))
        t = time.time()
        while iapp.stats.remote().result()["open"] > 1 and time.time() - t < 10:
            got.append(c.chunk(busy, x_of(63, len(got))))  # a call every 0.2 s
            time.sleep(0.2)
        stats = iapp.stats.remote().result()
        assert stats["open"] == 1 and stats["expired"] == 2, stats
        assert exact(got, 63) and len(got) >= 5  # it kept calling, and kept its state
        for s, sid in quiet.items():
            with pytest.raises(SessionUnknown, match="no call for 1 s"):
                (via if s == 61 else c).chunk(sid, x_of(s, 1))
            (via if s == 61 else c).close(sid)  # no error: it is already closed
        fresh = [via.open({"seed": s}) for s in (64, 65, 66)]  # 4 places: all free again
        for sid in [*fresh, busy]:
            via.close(sid)
    serve.delete(config.name)


def test_websocket_session_streams_exact_pcm(app):
    import json

    from websockets.sync.client import connect

    _wait_all_up(app)
    got = []
    with connect(f"ws://127.0.0.1:{HTTP['port']}/sessions", open_timeout=30) as ws:
        ws.send(json.dumps({"open": {"seed": 5}}))
        assert "session" in json.loads(ws.recv(timeout=30))
        for i in range(4):
            if i == 2:
                ws.send(json.dumps({"reset": True}))
                assert json.loads(ws.recv(timeout=30)) == {"ok": True}
            ws.send(json.dumps({"chunk": x_of(5, i).tolist()}))
            got.append(np.frombuffer(ws.recv(timeout=30), dtype=np.float32))
        ws.send(json.dumps({"what": 1}))
        assert json.loads(ws.recv(timeout=30))["error"] == "ValueError"
    assert exact(got, 5, reset_at=(2,))
    t = time.time()  # the session closes with the connection
    while _replicas(app)[0]["open"] + _replicas(app)[1]["open"] and time.time() - t < 10:
        time.sleep(0.1)
    assert sum(r["open"] for r in _replicas(app)) == 0


def test_replicas_device_memory_through_the_ingress(app):
    # a CPU replica counts no device memory; the window reset reaches every replica
    _wait_all_up(app)
    app.reset_peak_memory.remote().result()
    assert [r["server"]["device_memory"] for r in _replicas(app)] == [None, None]


def test_bad_params_are_refused_by_name_and_hold_no_place(app, client):
    _wait_all_up(app)
    with pytest.raises(TypeError, match="mapping of name to value, got str"):
        client.open("seed=1")
    with pytest.raises(TypeError, match="mapping of name to value, got list"):
        app.open.remote([("seed", 1)]).result()
    assert sum(r["headroom"] for r in _replicas(app)) == 4


def test_a_client_shut_down_leaves_no_thread_behind(app):
    from duplexcadence.runtime.serve import SessionClient

    _wait_all_up(app)
    c = SessionClient(TOY.name)
    sid = c.open({"seed": 3})
    assert exact([c.chunk(sid, x_of(3, 0))], 3) and c.following
    c.close(sid)
    c.shutdown()
    assert not c.following


def test_an_ingress_on_grpc_serves_exact_sessions_and_loses_a_killed_replicas(app):
    """A second application whose ingress reaches its replicas by Serve's gRPC transport
    (``transport="grpc"``): sessions through it equal their solo stock runs, and a killed
    replica's sessions are lost (the others untouched)."""
    import dataclasses

    from ray import serve

    from duplexcadence.runtime.serve.launch import start

    config = dataclasses.replace(TOY, name="serve_toy_grpc", transport="grpc")
    grpc_app = start(config, route_prefix="/grpc")
    rs = _wait_all_up(grpc_app)
    via = ViaIngress(grpc_app)
    sids = {s: via.open({"seed": s}) for s in (31, 32)}
    pins = {s: int(sids[s].split("-")[1] == rs[1]["incarnation"][:8]) for s in sids}
    assert sorted(pins.values()) == [0, 1]  # least loaded first: one per replica
    got = {s: [via.chunk(sids[s], x_of(s, i)) for i in range(3)] for s in sids}
    assert all(exact(got[s], s) for s in sids)
    _kill(config.name, "replica_0")
    # ray.kill returns before the actor is gone (a chunk right after it may still be
    # answered), so both sessions keep stepping until the victim's is lost
    doomed, survivor = (s for s in sorted(sids, key=pins.get))
    lost_at, t = None, time.time()
    while lost_at is None and time.time() - t < 10:
        try:
            got[doomed].append(via.chunk(sids[doomed], x_of(doomed, len(got[doomed]))))
        except SessionLost:
            lost_at = time.time() - t
        got[survivor].append(via.chunk(sids[survivor], x_of(survivor, len(got[survivor]))))
        time.sleep(0.05)
    assert lost_at is not None and lost_at < 2.0, f"lost after {lost_at} s (None: never)"
    assert exact(got[doomed], doomed)  # every chunk it did get was right
    assert exact(got[survivor], survivor)  # untouched: every chunk, every byte
    for sid in sids.values():
        try:
            via.close(sid)
        except SessionLost:
            pass
    serve.delete(config.name)


def test_a_restarted_ingress_keeps_every_open_session(app, client):
    """Serve restarts a killed ingress with an empty table; it adopts what each replica
    reports open, under the same ids: a client's session and an ingress-path session go
    on byte for byte through it, close normally, and their places are counted. Last in
    this file: the ingress it kills is the module's."""

    rs = _wait_all_up(app)
    a = client.open({"seed": 71})
    b = app.open.remote({"seed": 72}).result()
    got = {71: [client.chunk(a, x_of(71, 0))], 72: [app.chunk.remote(b, x_of(72, 0)).result()]}
    _kill(TOY.name, "Ingress")
    t = time.time()
    # until the new ingress answers for both sessions (Serve's restart of a killed actor
    # took over 30 s once on a 2-core machine under other load: 60 s)
    while time.time() - t < 60:
        got[71].append(client.chunk(a, x_of(71, len(got[71]))))  # straight to the replica
        try:
            got[72].append(app.chunk.remote(b, x_of(72, len(got[72]))).result(timeout_s=10))
            if app.stats.remote().result()["open"] == 2:
                break
        except Exception:  # noqa: BLE001 - the ingress is down or starting
            pass
        time.sleep(0.2)
    stats = app.stats.remote().result()
    assert stats["open"] == 2 and [r["incarnation"] for r in stats["replicas"]] == [
        r["incarnation"] for r in rs
    ]
    got[72].append(app.chunk.remote(b, x_of(72, len(got[72]))).result())
    assert exact(got[71], 71) and exact(got[72], 72) and len(got[72]) >= 3
    client.close(a)
    app.close.remote(b).result()
    assert app.stats.remote().result()["open"] == 0
