"""Closed-form extents and widths, and the compiler's arithmetic tied to the runtime's.

* K = ceil(W/s) + 1 at every size (2**31 and 2**52 frames answer at once);
* joint extents of mixed lifetimes == a brute-force walk over every restart pattern;
* width <= bound for every callable, past any enumeration limit;
* the compiler's attended extents == a stream simulated with the runtime's retention
  classes (`retained_length`), and its staging bytes == `TensorSpec.nbytes`: one fact,
  two implementations, kept equal here (the compiler does not import torch).
"""

import itertools
import math
import time

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from duplexcadence.compiler.analysis import BOUND_CAP, DTYPE_BYTES, tensor_bytes
from duplexcadence.compiler.driver import check_source
from duplexcadence.compiler.extents import AmountSet, Progression, joint_count, joint_states
from duplexcadence.dsl import ir
from duplexcadence.runtime import HeadTail, Ring, TensorSpec, Window
from fuzzing import TORCH_DTYPE


def test_closed_form_k_at_sizes_no_enumeration_could_reach():
    for window, stride in [(2**31, 1), (2**52, 3), (10**15, 7)]:
        p = Progression(start=0, stride=stride, bound=window)
        began = time.perf_counter()
        assert p.count == math.ceil(window / stride) + 1
        assert p.values(limit=1000) is None  # never listed
        assert p.at(p.count - 1) == window and p.at(p.count - 2) < window
        assert time.perf_counter() - began < 0.5  # enumerating even 2**31 values would take minutes


def _brute_joint(sizes):
    """Every restart pattern: c_1 <= c_2 <= ... calls since each level's restart."""
    reach = set()
    top = max(sizes) + 1
    for c in itertools.product(range(top), repeat=len(sizes)):
        if all(a <= b for a, b in zip(c, c[1:])):
            reach.add(tuple(min(ci, m - 1) for ci, m in zip(c, sizes)))
    return reach


@given(st.lists(st.integers(1, 7), min_size=1, max_size=4))
def test_joint_count_of_mixed_lifetimes_matches_every_restart_pattern(sizes):
    assert joint_count(sizes) == len(_brute_joint(sizes))


LIFETIMES = ["turn", "session", "process"]


@given(
    st.lists(
        st.tuples(
            st.integers(0, 20), st.integers(1, 9), st.integers(1, 40), st.sampled_from(LIFETIMES)
        ),
        min_size=1,
        max_size=3,
    )
)
def test_joint_states_are_the_reachable_extents(regions):
    progressions, lifetimes = [], []
    for start, stride, extra, lifetime in regions:
        progressions.append(Progression(start, stride, start + extra))
        lifetimes.append(lifetime)
    states = joint_states(progressions, lifetimes, limit=10**6)
    level = {lt: i for i, lt in enumerate(LIFETIMES)}
    order = sorted(set(lifetimes), key=level.get)
    sizes = [max(p.count for p, lt in zip(progressions, lifetimes) if lt == o) for o in order]
    expected = {
        tuple(p.at(x[order.index(lt)]) for p, lt in zip(progressions, lifetimes))
        for x in _brute_joint(sizes)
    }
    assert set(states) == expected and len(states) == len(expected)


def test_one_lifetime_is_lock_step_and_in_call_order():
    a, b = Progression(302, 50, 402), Progression(10, 1, 14)
    states = joint_states([a, b], ["turn", "turn"], limit=100)
    assert states == [(302, 10), (352, 11), (402, 12), (402, 13), (402, 14)]


MIXED = """
contract mixed
catalog budget {budget}
clock chunk = 1 per call
clock frame = 1 per chunk
region a {{
  dtype float32
  dims [frame, 2]
  lifetime {la}
  retention window({wa} frame)
  attended from {sa} frame by {ta} frame
}}
region b {{
  dtype float32
  dims [frame, 2]
  lifetime {lb}
  retention window({wb} frame)
  attended from {sb} frame by {tb} frame
}}
callable step {{
  site model.step
  per chunk
  arg x: region a
  arg y: region b
  kwarg flag: bool
  config flag in {{false, true}}
  mode eager
}}
"""


@settings(max_examples=60, deadline=None)
@given(
    wa=st.integers(1, 2**40),
    wb=st.integers(1, 2**40),
    fa=st.floats(0, 1),
    fb=st.floats(0, 1),
    ta=st.integers(1, 2**20),
    tb=st.integers(1, 2**20),
    la=st.sampled_from(["turn", "session", "operator", "chunk"]),
    lb=st.sampled_from(["turn", "session", "process"]),
)
def test_width_never_exceeds_bound_at_any_size(wa, wb, fa, fb, ta, tb, la, lb):
    ta, tb = min(ta, wa), min(tb, wb)
    text = MIXED.format(
        budget=1000,
        wa=wa,
        wb=wb,
        sa=int(fa * wa),
        sb=int(fb * wb),
        ta=ta,
        tb=tb,
        la=la,
        lb=lb,
    )
    began = time.perf_counter()
    result = check_source(text, "mixed.clock")
    assert time.perf_counter() - began < 2
    assert result.analysis is not None, result.diagnostics
    regions = {r.name: r for r in result.analysis.regions}
    [k] = result.analysis.callables
    for name, window, frac, stride in (("a", wa, fa, ta), ("b", wb, fb, tb)):
        start = int(frac * window)
        assert regions[name].catalog_width == (
            math.ceil((window - start) / stride) + 1 if window > start else 1
        )
    assert k.q_size == 2
    assert k.bound == min(2 * regions["a"].catalog_width * regions["b"].catalog_width, BOUND_CAP)
    assert k.width <= k.bound
    if la == lb and k.enumerated:  # lock-step: the larger K, per signature
        assert k.width == 2 * max(regions["a"].catalog_width, regions["b"].catalog_width)


# ---------------------------------------------------------------- tied to the runtime
def _runtime_policy(kind, params):
    if kind == "head_tail":
        return HeadTail(head=params[0], tail=params[1])
    return Window(width=params[0]) if kind == "window" else Ring(capacity=params[0])


def _simulate(policy, start, stride, calls):
    """The attended extent call by call, as a carry with the runtime's policy keeps it."""
    seen, length = [], start
    for _ in range(calls):
        seen.append(length)
        if policy.appends:  # a ring receives the new frames; `written` is its state
            length = policy.retained_length(stride, written=length)
        else:  # the whole history arrives: the carry plus the call's new frames
            length = policy.retained_length(length + stride)
    return seen


@given(
    kind=st.sampled_from(["head_tail", "window", "ring"]),
    a=st.integers(0, 300),
    b=st.integers(1, 300),
    stride=st.integers(1, 90),
    start_frac=st.floats(0, 1),
)
def test_compiler_extents_equal_a_stream_with_the_runtime_retention(kind, a, b, stride, start_frac):
    params = (a, b) if kind == "head_tail" else (a + b,)
    bound = sum(params)
    start = int(start_frac * bound)
    p = Progression(start, stride, bound)  # what analysis.progression makes of the region
    policy = _runtime_policy(kind, params)
    assert bound == (policy.capacity if kind != "head_tail" else policy.head + policy.tail)
    simulated = _simulate(policy, start, stride, calls=p.count + 5)
    assert simulated[: p.count] == list(p.values(limit=10_000))
    assert set(simulated) == set(p.values(limit=10_000))


def test_dtype_sizes_are_torchs():
    assert set(TORCH_DTYPE) == set(DTYPE_BYTES)
    for name, dtype in TORCH_DTYPE.items():
        assert DTYPE_BYTES[name] == torch.empty((), dtype=dtype).element_size()


@given(
    dims=st.lists(st.integers(0, 6), min_size=1, max_size=4),
    pad=st.lists(st.integers(0, 5), min_size=4, max_size=4),
    offset=st.integers(0, 9),
    strided=st.booleans(),
    dtype=st.sampled_from(sorted(TORCH_DTYPE)),
)
def test_staging_bytes_equal_the_runtime_tensorspec(dims, pad, offset, strided, dtype):
    strides = None
    if strided:  # row-major with padding: what a view into a wider buffer has
        strides, acc = [], 1
        for d, extra in zip(reversed(dims), pad):
            strides.insert(0, acc)
            acc *= d + extra
    arg = ir.TensorArg(
        dtype=dtype,
        dims=tuple(ir.Quantity(value=d) for d in dims),
        strides=tuple(ir.Quantity(value=s) for s in strides) if strides else None,
        offset=ir.Quantity(value=offset),
    )
    checked = check_source("contract t\n", "t.clock").checked
    spec = TensorSpec(
        tuple(dims), TORCH_DTYPE[dtype], stride=tuple(strides) if strides else None, offset=offset
    )
    assert tensor_bytes(arg, checked, {}) == spec.nbytes()


def _flush_by_walking(p: Progression, flushes):
    """Extents one partial flush reaches, walked call by call (the former algorithm)."""
    steady = set(p.values(limit=10**6))
    extra: set[int] = set()
    for f in flushes:
        for a in steady:
            b = min(a + f, p.bound)
            while b not in steady and b not in extra:
                extra.add(b)
                b = min(b + p.stride, p.bound)
    return tuple(sorted(extra))


@given(
    start=st.integers(0, 60),
    stride=st.integers(1, 25),
    extra=st.integers(0, 200),
    flushes=st.lists(st.integers(1, 80), max_size=4),
)
def test_flush_extents_closed_form_equals_the_walk(start, stride, extra, flushes):
    p = Progression(start, stride, start + extra)
    walked = _flush_by_walking(p, flushes)
    assert p.flush_values(tuple(flushes), limit=10**6) == walked
    assert p.flush_count(tuple(flushes)) == len(walked)


def _big_contract(n: int) -> str:
    out = ["contract big", "clock c0 = 1 per call"]
    out += [f"clock c{i} = 1 per c{i - 1}" for i in range(1, n)]
    out += [f"const k{i} = {i % 7 + 1} c0" for i in range(n)]
    for i in range(n):
        out.append(
            f"region r{i} {{\n  dtype float32\n  dims [2, c0]\n  retention head(k{i}) ++ tail(3 c0)"
            f'\n  attended from k{i} by 1 c0\n  site m{i}.state["r"]\n}}'
        )
        out.append(
            f"callable f{i} {{\n  site m{i}.step\n  per c0\n  arg x: region r{i}\n"
            f'  kwarg flag: bool\n  kwarg cache["a"]: float32 [1, n]\n  config flag in {{false, true}}'
            f"\n  config n in {{1, 2}}\n  aliased r{i}\n  retains r{i} from result[1]\n}}"
        )
    return "\n".join(out) + "\n"


def test_check_time_is_linear_in_contract_size():
    def best_of_three(text):
        times = []
        for _ in range(3):
            began = time.perf_counter()
            assert check_source(text, "big.clock").ok
            times.append(time.perf_counter() - began)
        return min(times)

    small, large = best_of_three(_big_contract(40)), best_of_three(_big_contract(160))
    assert large / small < 8  # x4 the size: quadratic work would be x16


# ------------------------------------------- a staged argument as long as a region extent
STAGED_BY_EXTENT = """
contract staged_args
clock chunk = 1 per call
clock frame = 2 per chunk
region carry {{
  dtype float32
  dims [4, frame]
  lifetime turn
  mutability mutable
  retention head(6 frame) ++ tail(4 frame)
  attended from 6 frame by 2 frame until 10 frame
  site cache["carry"]
}}
region other {{
  dtype float32
  dims [4, frame]
  lifetime turn
  mutability mutable
  retention window(8 frame)
  attended from 8 frame by 2 frame until 8 frame
  site cache["other"]
}}
callable step {{
  site model.step
  per chunk
  arg side: float32 [3, {length}]
  arg carry: region carry
  config last in {{false, true}}
  kwarg last: bool
  aliased carry
  retains carry from result[1]
}}
"""


def test_a_staged_argument_follows_its_region_extent_class_by_class():
    from duplexcadence.compiler.driver import compile_source

    result = compile_source(STAGED_BY_EXTENT.format(length="extent(carry) + 1 frame"), "s.clock")
    assert result.ok, result.diagnostics
    [k] = result.analysis.callables
    # the extent's 3 states x 2 flags: no config of its own multiplies the catalog
    assert k.width == 6 and len(k.classes) == 6
    # the generated catalog (rows form), expanded to its classes: each class stages the
    # side input at its own carry extent
    [code] = [text for name, text in result.files.items() if name.endswith("contract.py")]
    namespace: dict = {}
    exec(compile(code, "contract.py", "exec"), namespace)
    classes = namespace["DECLARED"].callables[0].classes
    staged = sorted((c.args[0].shape, c.args[1].extent) for c in classes)
    assert staged == sorted(((3, e + 1), e) for e in (6, 8, 10) for _ in range(2))
    # staging bytes per class: 3 x (extent + 1) float32, summed over the classes
    assert k.staging_bytes == sum(2 * 3 * (e + 1) * 4 for e in (6, 8, 10))


def test_a_region_argument_is_never_staged_aliased_or_not():
    """Eq. (6) counts what the runtime stages: a region argument is read where the
    region lies (RegionView, admitted at its pointer), so it adds no staging, declared
    `aliased` or not; the compiler's number is the runtime's, class by class."""
    from duplexcadence.compiler.driver import compile_source
    from duplexcadence.runtime import staging_bytes

    text = STAGED_BY_EXTENT.format(length="4").replace(
        "  arg carry: region carry\n", "  arg carry: region carry\n  arg other: region other\n"
    )
    result = compile_source(text, "s.clock")
    assert result.ok, result.diagnostics
    [k] = result.analysis.callables
    [code] = [text for name, text in result.files.items() if name.endswith("contract.py")]
    namespace: dict = {}
    exec(compile(code, "contract.py", "exec"), namespace)
    classes = namespace["DECLARED"].callables[0].classes
    assert {type(c.args[2]).__name__ for c in classes} == {"RegionView"}  # `other`, unaliased
    assert k.staging_bytes == sum(staging_bytes(c) for c in classes) == 6 * 3 * 4 * 4


def test_extent_in_an_argument_must_name_a_region_argument_of_the_callable():
    result = check_source(STAGED_BY_EXTENT.format(length="extent(other)"), "s.clock")
    assert not result.ok
    [d] = [d for d in result.diagnostics if d.severity == "error"]
    assert d.code == "CLK011" and "extent(other)" in d.message


# ---- stepped clocks: a verifier commits a data-dependent amount per call
def _brute_sums_below(amounts, x):
    """The sums of amounts (with repetition, 0 included) below x, walked one by one."""
    reach = {0}
    for n in range(x):
        if n in reach:
            reach.update(n + s for s in amounts)
    return sorted(n for n in reach if n < x)


amount_sets = st.one_of(
    st.tuples(st.integers(1, 12), st.integers(0, 10)).map(lambda t: AmountSet(t[0], t[0] + t[1])),
    st.lists(st.integers(1, 30), min_size=1, max_size=4).map(AmountSet.of),
)


def _amounts(steps: AmountSet) -> tuple[int, ...]:
    return steps.listed or tuple(range(steps.lo, steps.hi + 1))


@settings(deadline=None)
@given(amount_sets, st.integers(0, 300))
def test_sums_below_a_window_closed_form_equals_the_walk(steps, window):
    sums = _brute_sums_below(_amounts(steps), window)
    assert steps.count_below(window) == len(sums)
    assert [steps.kth(k) for k in range(len(sums))] == sums


@settings(max_examples=60, deadline=None)
@given(amount_sets, st.integers(0, 20), st.integers(1, 200), st.randoms(use_true_random=False))
def test_a_verifier_stream_reaches_exactly_the_attended_extents(steps, start, window, rng):
    """Commit random amounts until the window is full, many times: every retained extent
    met is attended, and together the streams meet every attended extent."""
    p = Progression(start, steps.lo, start + window, steps)
    attended = p.values(limit=10_000)
    assert len(attended) == p.count and attended[-1] == p.bound
    met = set()
    for _ in range(20):
        n = 0
        while start + n < p.bound:
            met.add(start + n)
            n += rng.choice(_amounts(steps))
        met.add(p.bound)
    assert met <= set(attended)
    # every attended extent is a sum the walk can reach: a stream committing the smallest
    # amounts that reach it (the walk above samples; this constructs)
    assert set(attended) == {start + n for n in _brute_sums_below(_amounts(steps), window)} | {
        p.bound
    }


def test_stepped_clock_counts_are_closed_form_at_any_window():
    began = time.perf_counter()
    assert Progression(0, 1, 2**52, AmountSet(1, 8)).count == 2**52 + 1
    assert Progression(0, 3, 2**52, AmountSet(3, 3)).count == math.ceil(2**52 / 3) + 1
    # {4, 6}: every even number from 8 on, 0 and 4 below it
    p = Progression(0, 4, 10**15, AmountSet.of([4, 6]))
    assert p.count == 10**15 // 2 - 1 + 1  # evens below 10**15 but 2, plus the bound
    assert p.at(p.count - 2) == 10**15 - 2 and p.values(limit=1000) is None
    assert time.perf_counter() - began < 0.5


def test_a_verify_contract_counts_its_exact_shape_catalog():
    """Whisper's verifier on an exact-shape KV: 449 extents (every length 0..448, one
    amount is 1) x 9 widths, out of a budget of 1000: the compiler says so."""
    source = """contract verify
catalog budget 1000
clock round = 1 per call
clock commit = 1..9 per round
region kv {
  dtype bfloat16
  dims [2, commit, 64]
  retention window(448 commit)
  attended from 0 commit by commit
}
callable step {
  site model.decoder
  per round
  arg tokens: int64 [1, w]
  arg kv: region kv
  config w in {1, 2, 3, 4, 5, 6, 7, 8, 9}
}
"""
    result = check_source(source, "verify.clock")
    (k,) = result.analysis.callables
    assert (k.width, k.in_scope) == (449 * 9, False)
    assert "CLK030" in {d.code for d in result.diagnostics}
    # committing 2 or 3 a round (no single-token rounds) reaches every length but 1
    even = check_source(source.replace("1..9", "2..3"), "verify.clock").analysis
    assert even.regions[0].catalog_width == 448 and even.regions[0].steps == "2..3"
    assert 1 not in even.regions[0].attended


SPECULATIVE_RING = """contract wake
clock frame = 1 per call
region kv {{
  dtype bfloat16
  dims [2, frame, 64]
  retention ring({capacity} frame)
  attended from 0 frame by 1 frame until {attended} frame
  speculative {slack} frame
}}
"""


@settings(max_examples=60, deadline=None)
@given(
    capacity=st.integers(2, 5000),
    slack=st.integers(1, 64),
    attended=st.integers(1, 5064),
)
def test_a_speculative_ring_holds_what_it_attends_and_its_slack(capacity, slack, attended):
    """A ring of N written up to S entries past its committed end keeps N - S committed
    ones: attending more is refused (CLK052: the speculative write wraps onto entries the
    first queries read), less is the usual disagreement with the retention (CLK022)."""
    text = SPECULATIVE_RING.format(capacity=capacity, slack=slack, attended=attended)
    result = check_source(text, "wake.clock")
    codes = {d.code for d in result.diagnostics if d.severity.name == "ERROR"}
    if slack >= capacity:
        assert codes == {"CLK052"}
    elif attended + slack > capacity:
        assert codes == {"CLK052"}
    elif attended + slack < capacity:
        assert codes == {"CLK022"}
    else:
        assert result.ok, result.diagnostics
        (r,) = result.analysis.regions
        assert (r.bound, r.envelope, r.speculative) == (attended, capacity, slack)
        assert r.shape == (2, capacity, 64)
        assert r.speculative_bytes == slack * 2 * 64 * 2  # bfloat16 entries of [2, ., 64]


def test_a_speculative_window_is_allocated_with_its_slack_and_commits_are_reported():
    source = """contract verify
clock round = 1 per call
clock commit = 1..9 per round
region kv {
  dtype float32
  dims [2, commit, 64]
  retention window(448 commit)
  attended from 0 commit by commit
  speculative 8 commit
}
region wake_kv { dtype float32  dims [1, commit, 4]  retention window(8 commit)  speculative 3 commit }
callable step {
  site model.decoder
  per round
  arg tokens: int64 [1, w]
  arg kv: region kv
  config w in {1, 2, 3, 4, 5, 6, 7, 8, 9}
  commits kv by commit
  commits wake_kv by w - 1 + 1
  mode eager
}
"""
    result = check_source(source, "verify.clock")
    assert result.ok, result.diagnostics
    kv, wake = result.analysis.regions
    assert (kv.bound, kv.envelope, kv.shape) == (448, 456, (2, 456, 64))
    assert kv.demand_bytes == 2 * 456 * 64 * 4 and kv.speculative_bytes == 2 * 8 * 64 * 4
    (k,) = result.analysis.callables
    widths = ",".join(f"w={w}:{w}" for w in range(1, 10))
    assert k.commits == (("kv", "1..9"), ("wake_kv", widths))
    unlisted = check_source(source.replace("  speculative 8 commit\n", ""), "v.clock")
    assert {d.code for d in unlisted.diagnostics} >= {"CLK053"}
