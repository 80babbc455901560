"""ExactShapeReplay on a real GPU: bit-exact replay, RNG, admission, audit.

Run with ``pytest -m cuda tests/test_runtime_cuda.py``; every test skips cleanly
without CUDA (tests/conftest.py). The workload is a small synthetic attention step
with a KV-like carry (head(6) ++ tail(8), 4 new frames per chunk, so the attended
extent walks 6 → 10 → 14 and stays at 14: three classes) and a write-through
accumulator — unit tests of the engine, not of any model.
"""

from __future__ import annotations

import math
import pytest
import torch

from duplexcadence.runtime import (
    CaptureClass,
    CarryRegion,
    Effect,
    ExactShapeReplay,
    HeadTail,
    RegionSpec,
    RegionView,
    ReplayMiss,
    TensorSpec,
    Window,
    bitwise_equal,
    format_report,
    pin_determinism,
    set_replay_enabled,
    set_strict,
    strict,
)

pytestmark = pytest.mark.cuda

DEV = torch.device("cuda")
P, R, CHUNK, DIM, CAP = 6, 8, 4, 16, 16
EXTENTS = (6, 10, 14)


@pytest.fixture(autouse=True)
def _envelope(monkeypatch):
    monkeypatch.delenv("DUPLEXCADENCE_DISABLE_REPLAY", raising=False)
    monkeypatch.delenv("DUPLEXCADENCE_STRICT", raising=False)
    with pin_determinism():
        yield
    set_replay_enabled(None)
    set_strict(None)


def host_randn(*shape, seed):
    """Inputs drawn on the host from a private generator: the global CUDA
    generator stays untouched, so RNG tests see only the callable's draws."""
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(DEV)


class Attn:
    def __init__(self, audit=False):
        self.wq = host_randn(DIM, DIM, seed=1) / 4
        self.wk = host_randn(DIM, DIM, seed=2) / 4
        spec = RegionSpec("kv", torch.float32, (2, CAP, DIM), 1, "session", "mutable")
        self.kv = CarryRegion(spec, HeadTail(P, R), DEV, audit=audit)
        self.acc = torch.zeros(DIM, device=DEV)
        self.calls = 0

    def step(self, x, kv):
        self.calls += 1
        h = torch.cat([kv, x @ self.wk], dim=1)
        att = torch.softmax((x @ self.wq) @ h.transpose(1, 2) * 0.25, dim=-1)
        y = att @ h
        self.acc.add_(y.sum(dim=(0, 1)))  # write-through: in place, fixed address
        return y, h

    def prime(self):
        self.kv.adopt(host_randn(2, P, DIM, seed=3))


def make_replay(model, **kw):
    classes = [
        CaptureClass(
            f"T{t}", (TensorSpec((2, CHUNK, DIM), torch.float32, "randn"), RegionView("kv", t))
        )
        for t in EXTENTS
    ]
    return ExactShapeReplay(
        model.step,
        name="attn",
        classes=classes,
        regions={"kv": model.kv},
        write_through={"acc": lambda: model.acc},
        device=DEV,
        **kw,
    )


def run_stream(model, fn, chunks, start=0):
    outs = []
    for i in range(start, start + chunks):
        y, h = fn(host_randn(2, CHUNK, DIM, seed=100 + i), model.kv.current())
        model.kv.retain(h)
        outs.append(y)
    return outs


def test_replay_bit_exact_for_every_class():
    ref, m = Attn(), Attn(audit=True)
    eng = make_replay(m).capture_all(progress=False)
    ref.prime()
    m.prime()
    with torch.inference_mode():
        want = run_stream(ref, ref.step, 7)
        got = run_stream(m, eng, 7)
    for i, (a, b) in enumerate(zip(want, got)):
        assert bitwise_equal(a, b), f"chunk {i} differs"
    assert bitwise_equal(ref.acc, m.acc) and bitwise_equal(ref.kv.current(), m.kv.current())
    s = eng.stats()
    assert s["misses"] == {} and s["hits"] == 7
    assert [c["hits"] for c in s["classes"]] == [1, 1, 5]  # every class replayed
    assert m.kv.audit_checks == 8 and m.kv.audit_divergences == 0  # 7 retains + adopt
    print(format_report([eng, m.kv]))


def test_capture_once_before_first_call_and_transparent():
    m = Attn()
    eng = make_replay(m, warmup=2)
    m.prime()
    kv0, acc0 = m.kv.tensor.clone(), m.acc.clone()
    rng0, host0 = torch.cuda.get_rng_state(), torch.get_rng_state()
    eng.capture_all(progress=False)
    # the first class: probe, one more warm-up, the capture; the other two: probe, capture
    assert m.calls == 3 + 2 * 2
    at_capture = m.calls
    assert all(c["status"] == "captured" for c in eng.stats()["classes"])
    assert torch.equal(m.kv.tensor, kv0) and torch.equal(m.acc, acc0)
    assert torch.equal(torch.cuda.get_rng_state(), rng0) and torch.equal(
        torch.get_rng_state(), host0
    )
    with torch.no_grad(), strict():  # strict: the very first real call must hit
        run_stream(m, eng, 4)
    assert m.calls == at_capture  # replays never call into Python
    eng.capture_all(progress=False)
    assert m.calls == at_capture and eng.hits == 4
    assert all(c["reserved_bytes"] is not None for c in eng.stats()["classes"])


def test_outputs_survive_later_replays():
    m = Attn()
    eng = make_replay(m).capture_all(progress=False)
    m.prime()
    with torch.no_grad():
        y1, h1 = eng(host_randn(2, CHUNK, DIM, seed=5), m.kv.current())
        keep = y1.clone()
        y2, _ = eng(host_randn(2, CHUNK, DIM, seed=6), m.kv.current())
    assert torch.equal(y1, keep) and y1.data_ptr() != y2.data_ptr()


def test_device_rng_consecutive_replays_equal_eager():
    def noisy(x):
        return x * torch.rand_like(x) + torch.randn(x.shape, device=x.device)

    classes = [
        CaptureClass(f"n{n}", (TensorSpec((n, 32), torch.float32, "randn"),)) for n in (8, 16)
    ]
    eng = ExactShapeReplay(
        noisy,
        name="noisy",
        classes=classes,
        regions={},
        declared_effect=Effect.DEVICE_RNG,
        device=DEV,
    )
    torch.cuda.manual_seed(1234)
    start = torch.cuda.get_rng_state()
    eng.capture_all(progress=False)
    assert torch.equal(torch.cuda.get_rng_state(), start)
    xs = [host_randn(8 if i % 3 else 16, 32, seed=i) for i in range(6)]
    eager = [noisy(x) for x in xs]
    end = torch.cuda.get_rng_state()
    torch.cuda.set_rng_state(start)
    with torch.no_grad():
        replayed = [eng(x) for x in xs]
    for i, (a, b) in enumerate(zip(eager, replayed)):
        assert bitwise_equal(a, b), f"replay {i} drew different numbers"
    assert not torch.equal(eager[1], eager[2])  # really random, call to call
    assert torch.equal(torch.cuda.get_rng_state(), end)  # offset advanced as eager
    assert eng.stats()["effect"] == "device_rng" and eng.hits == 6


def test_host_rng_callable_rejected():
    def host_noisy(x):
        return x + torch.rand(x.shape).to(x.device)

    eng = ExactShapeReplay(
        host_noisy,
        name="host_noisy",
        regions={},
        device=DEV,
        classes=[CaptureClass("c", (TensorSpec((4,), torch.float32),))],
    )
    host0 = torch.get_rng_state()
    eng.capture_all(progress=False)
    assert torch.equal(torch.get_rng_state(), host0)
    assert eng.rejected == "host_rng"
    assert eng.stats()["classes"][0]["status"] == "rejected"
    with torch.no_grad():
        eng(torch.zeros(4, device=DEV))
        with strict(), pytest.raises(ReplayMiss, match="host_rng"):
            eng(torch.zeros(4, device=DEV))
    assert eng.stats()["misses"] == {"host_rng": 2}


def test_write_through_drift_detected_and_falls_back():
    ref, m = Attn(), Attn()
    eng = make_replay(m).capture_all(progress=False)
    ref.prime()
    m.prime()
    with torch.no_grad():
        run_stream(ref, ref.step, 1)
        run_stream(m, eng, 1)
        ref.acc = torch.zeros_like(ref.acc)
        m.acc = torch.zeros_like(m.acc)  # the model re-pointed its buffer
        want = run_stream(ref, ref.step, 2, start=1)
        got = run_stream(m, eng, 2, start=1)
    assert all(bitwise_equal(a, b) for a, b in zip(want, got))
    assert bitwise_equal(ref.acc, m.acc)  # eager wrote the new buffer, graph did not
    s = eng.stats()
    assert s["invalidations"] == 2  # classes T10 and T14 each dropped on first use
    assert s["misses"] == {"write_through_pointer": 2} and s["hits"] == 1
    assert [c["status"] for c in s["classes"]] == ["captured", "invalidated", "invalidated"]


def test_signature_miss_runs_eager_and_is_counted():
    ref, m = Attn(), Attn()
    eng = make_replay(m).capture_all(progress=False)
    odd = host_randn(2, 8, DIM, seed=9)  # extent 8 is outside the catalog
    ref.kv.adopt(odd)
    m.kv.adopt(odd)
    with torch.no_grad():
        want = run_stream(ref, ref.step, 1)
        got = run_stream(m, eng, 1)
    assert bitwise_equal(want[0], got[0])
    assert eng.stats()["misses"] == {"signature": 1} and eng.hits == 0


def test_shared_pool_between_replays():
    a, b = Attn(), Attn()
    ea = make_replay(a).capture_all(progress=False)
    eb = make_replay(b, pool=ea.pool).capture_all(progress=False)
    assert eb.pool is ea.pool
    ref = Attn()
    for mod in (a, b, ref):
        mod.prime()
    with torch.no_grad():
        want = run_stream(ref, ref.step, 4)
        got_a = run_stream(a, ea, 4)
        got_b = run_stream(b, eb, 4)
    assert all(bitwise_equal(x, y) and bitwise_equal(x, z) for x, y, z in zip(want, got_a, got_b))
    assert ea.hits == eb.hits == 4


def test_a_failed_capture_leaves_the_pool_usable():
    """A capture that fails (here a host sync inside it) must leave neither the
    allocator recording into the pool nor the generator capturing: the next capture
    into the same pool succeeds and replays, and eager draws still work."""
    from duplexcadence.runtime.engine.backend import CudaGraphBackend

    backend = CudaGraphBackend()
    pool = backend.new_pool(DEV)
    x = torch.arange(8.0, device=DEV)

    def syncs(t):
        y = t * 2
        y.sum().item()  # not permitted while the stream is capturing
        return y

    with pytest.raises(Exception):
        backend.capture(syncs, (x,), {}, DEV, pool)
    torch.randn(4, device=DEV)  # raised "Offset increment outside graph capture" before
    assert torch.cuda.current_stream(DEV) == torch.cuda.default_stream(DEV)
    captured = backend.capture(lambda t: t * 3 + 1, (x,), {}, DEV, pool)
    x.add_(1)
    captured.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured.outputs, x * 3 + 1)


def test_retain_allocates_nothing_on_device():
    carry = CarryRegion(
        RegionSpec("kv", torch.float32, (2, CAP, DIM), 1, "session", "mutable"), HeadTail(P, R), DEV
    )
    hist = host_randn(2, 30, DIM, seed=4)
    carry.retain(hist)  # first touch outside the measurement
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    out = carry.retain(hist)
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() == before
    assert out.data_ptr() == carry.data_ptr()
    assert torch.equal(out, torch.cat([hist[:, :P], hist[:, -R:]], dim=1))


def test_audit_catches_wrong_declaration_on_first_divergent_call():
    # Declared head(2) ++ tail(3); the "released code" keeps the newest 5.
    spec = RegionSpec("est", torch.float32, (1, 8), 1, "session", "mutable")
    carry = CarryRegion(spec, HeadTail(2, 3), DEV, audit=True, stock=Window(5).reference)
    for i in range(4):
        new = (torch.arange(2.0, device=DEV) + 10 * (i + 1)).reshape(1, 2)
        carry.retain(torch.cat([carry.current(), new], dim=1))
        assert carry.audit_divergences == (0 if i < 2 else i - 1)
    assert carry.audit_records[0].call == 3 and carry.audit_records[0].index == (0, 0)


@pytest.mark.cuda
def test_host_built_constants_and_istft_are_captured_exactly():
    """A callable that rebuilds a constant on the host and calls torch.istft every call
    (both forbid capture as written) replays bit-exact through the hoisted constants."""
    from duplexcadence.runtime.engine.hoist import istft_without_host_check

    dev = torch.device("cuda")
    window = torch.hann_window(16, periodic=True, device=dev)

    def vocoder_like(spec):
        freqs = torch.exp(-math.log(10000) * torch.arange(0, 8) / 8).to(spec.real)
        scaled = spec * freqs.sum()
        harmonics = torch.FloatTensor([[1.0, 2.0, 3.0]]).to(dev)
        audio = torch.istft(scaled, 16, 4, 16, window=window)
        return audio * harmonics.sum()

    torch.manual_seed(0)
    specs = [torch.randn(1, 9, 57, dtype=torch.complex64, device=dev) for _ in range(3)]
    for s in specs:
        assert torch.equal(
            torch.istft(s, 16, 4, 16, window=window),
            istft_without_host_check(s, 16, 4, 16, window=window),
        )
    engine = ExactShapeReplay(
        vocoder_like,
        name="vocoder_like",
        classes=[CaptureClass("T57", args=(TensorSpec((1, 9, 57), torch.complex64),))],
        regions={},
        device=dev,
    )
    engine.capture_all(progress=False)
    for s in specs:
        with torch.inference_mode():
            got = engine(s)
        assert torch.equal(got, vocoder_like(s))
    stats = engine.stats()
    assert stats["hits"] == 3, stats
    assert stats["host_constants"]["device_buffers"] >= 2
    assert stats["host_constants"]["istft_without_host_check"] >= 1


# ------------------------------------------------------------------ ambient state
from ambient_flips import flipped  # noqa: E402

from duplexcadence.runtime import Autocast  # noqa: E402
from duplexcadence.runtime.engine import ambient  # noqa: E402

FLIPPED = [n for n in ambient.names("cuda") if n != "cuda.current_device"]


@pytest.mark.parametrize("name", FLIPPED)
def test_changed_ambient_setting_never_replays(name):
    """Under any keyed setting changed after capture the call runs eager: its bytes are
    the eager bytes under that setting (often not the captured graph's)."""
    ref, m = Attn(), Attn()
    eng = make_replay(m).capture_all(progress=False)
    ref.prime()
    m.prime()
    with torch.inference_mode():
        x = host_randn(2, CHUNK, DIM, seed=7)
        with flipped(name):
            want, _ = ref.step(x, ref.kv.current())
            got, _ = eng(x, m.kv.current())
    assert bitwise_equal(want, got)
    assert eng.stats()["misses"] == {"ambient_state": 1}
    assert f"{name}: captured " in eng.stats()["miss_details"]["ambient_state"]


def test_declared_autocast_fp16_replays_exactly():
    """Classes captured under autocast(cuda, float16) replay bit-exact under it, and the
    float32 classes keep serving calls without autocast."""
    ref, m = Attn(), Attn()
    eng = make_replay(m, ambient=(Autocast(None), Autocast(torch.float16))).capture_all(
        progress=False
    )
    ref.prime()
    m.prime()
    with torch.inference_mode():
        for i in range(6):
            x = host_randn(2, CHUNK, DIM, seed=200 + i)
            ctx = (
                torch.autocast("cuda", dtype=torch.float16)
                if i % 2
                else torch.autocast("cuda", enabled=False)
            )
            with ctx:
                want, h_ref = ref.step(x, ref.kv.current())
                got, h = eng(x, m.kv.current())
            assert bitwise_equal(want, got), f"chunk {i} differs"
            ref.kv.retain(h_ref.float())
            m.kv.retain(h.float())
    s = eng.stats()
    assert s["misses"] == {} and s["hits"] == 6
    assert {c["ambient"] for c in s["classes"] if c["hits"]} == {"off", "float16"}


# ----------------------------------------------------------------------- sessions
import copy  # noqa: E402
from threads import run_clients  # noqa: E402

import toy_stream  # noqa: E402

from duplexcadence.runtime import bind_contract  # noqa: E402


def _session_of(pool, base, seed):
    obj = copy.copy(base)
    obj.prompt = toy_stream.Stream(base.net, seed).prompt
    obj.prime()
    return pool.open(obj, seed=seed)


@pytest.mark.parametrize("lanes, state_on", [(1, None), (4, None), (4, "cpu")])
def test_sessions_from_8_threads_every_session_exact(lanes, state_on):
    """One binding, 8 client threads, each a session with device randomness per call,
    served on 1 or 4 lanes (own stream, pool, cuBLAS workspace and generator state each),
    sessions keeping their state on the device or in pinned host memory: no crash, no
    hang, and every session equals its solo stock run bit for bit."""
    base = toy_stream.Stream(toy_stream.Net(DEV, noise=True), seed=0)
    binding = bind_contract(base, toy_stream.decl(noise=True), device=DEV, progress=False)
    pool = binding.sessions(lanes=lanes, progress=False, state_on=state_on)
    seeds = list(range(20, 28))
    n = 9
    got: dict[int, list] = {}

    def client(seed):
        s = _session_of(pool, base, seed)
        with torch.inference_mode():
            got[seed] = [s.run(s.obj.chunk, toy_stream.x_of(seed, i, DEV)).cpu() for i in range(n)]

    errors = run_clients(client, seeds, timeout_s=120)
    assert not errors, errors
    binding.unbind()
    for seed in seeds:
        with torch.inference_mode():
            want = [y.cpu() for y in toy_stream.solo_stock(seed, n, device=DEV, noise=True)]
        assert all(bitwise_equal(a, b) for a, b in zip(got[seed], want)), f"session {seed}"
    st = binding.stats()["callables"]["step"]
    assert st["hits"] >= len(seeds) * (n - 1) and st["effect"] == "device_rng"
