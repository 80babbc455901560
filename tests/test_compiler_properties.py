"""Properties of the analysis and of code generation (hypothesis)."""

import math

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from duplexcadence.compiler.analysis import progression
from duplexcadence.compiler.driver import check_source, compile_source
from duplexcadence.compiler.validate import RegionNumbers
from duplexcadence.dsl.parser import parse
from duplexcadence.dsl.printer import print_contract


def numbers(start, stride, head, tail, kind="head_tail"):
    bound = head + tail if kind == "head_tail" else head
    return RegionNumbers(
        dims=(None,),
        axis=0,
        axis_clock="frame",
        retention=(kind, (head, tail)),
        bound=bound,
        start=start,
        stride=stride,
        flush=(),
        envelope=bound,
        stock=None,
    )


def brute_force(start, stride, bound, calls=10_000):
    """Stream `calls` chunks through a literal carry and collect the lengths read."""
    seen, length = set(), start
    for _ in range(calls):
        seen.add(length)
        length = length + stride
        if length > bound:
            length = bound  # stock retention: cat(head, tail) keeps `bound` frames
    return seen


@given(
    head=st.integers(0, 400),
    tail=st.integers(1, 400),
    stride=st.integers(1, 120),
    start_frac=st.floats(0, 1),
)
def test_catalog_width_matches_formula_and_brute_force(head, tail, stride, start_frac):
    bound = head + tail
    start = int(start_frac * bound)
    p = progression(numbers(start, stride, head, tail))
    values = p.values(limit=10_000)
    assert len(set(values)) == len(values) == p.count
    assert p.count == (math.ceil((bound - start) / stride) + 1 if bound > start else 1)
    assert set(values) == brute_force(start, stride, bound)


CONTRACT = """
contract prop
catalog budget {budget}
clock chunk = 1 per call
clock frame = {stride} per chunk
const p = {head} frame
region carry {{
  dtype {dtype}
  dims [{lead}, frame, {trail}]
  retention head(p) ++ tail({tail} frame)
  attended from {start} frame by {stride} frame
  site state["carry"]
}}
region scratch {{
  dtype float32
  dims [{lead}, frame]
  envelope extent(carry) + {stride} frame
  site work
}}
region slots {{
  dtype float32
  dims [{n_slots}, {trail}]
  site conv
}}
callable step {{
  site model.step
  per chunk
  arg cache: region carry
  arg x: float32 [1, n]
  kwarg last: bool
  kwarg conv: region slots[k]
  config last in {{false, true}}
  config n in {{{ns}}}
  config k in {{{ks}}}
  mode {mode}
  aliased carry, slots
  writes scratch
  retains carry from result[1]
}}
"""

BYTES = {"float32": 4, "float16": 2, "int64": 8}

contract_params = st.fixed_dictionaries(
    {
        "head": st.integers(1, 200),
        "tail": st.integers(1, 200),
        "stride": st.integers(1, 80),
        "lead": st.integers(1, 4),
        "trail": st.integers(1, 4),
        "dtype": st.sampled_from(sorted(BYTES)),
        "ns": st.lists(st.integers(1, 9), min_size=1, max_size=3, unique=True).map(
            lambda xs: ", ".join(map(str, xs))
        ),
        "start_frac": st.floats(0, 1),
        "n_slots": st.integers(1, 4),
        "slot_picks": st.lists(st.integers(0, 3), min_size=1, max_size=4, unique=True),
    }
)


def slot_values(params):
    """The slot indexes `k` takes: picks folded into the region's leading axis."""
    return sorted({p % params["n_slots"] for p in params["slot_picks"]})


def render(params, budget=1000, mode="replay"):
    start = int(params["start_frac"] * params["head"])
    skip = ("start_frac", "slot_picks")
    return CONTRACT.format(
        budget=budget,
        mode=mode,
        start=start,
        ks=", ".join(map(str, slot_values(params))),
        **{k: v for k, v in params.items() if k not in skip},
    )


@settings(max_examples=40, deadline=None)
@given(contract_params)
def test_callable_catalog_respects_bound_and_plan_bytes(params):
    # widths past the largest budget are analysed all the same, for an eager callable
    result = check_source(render(params, mode="eager"), "prop.clock")
    assert result.ok, result.diagnostics
    a = result.analysis
    carry = next(r for r in a.regions if r.name == "carry")
    step = a.callables[0]
    n_values = len(params["ns"].split(","))
    n_slots = len(slot_values(params))
    assert step.q_size == 2 * n_values * n_slots  # a slot index counts like any config
    assert step.slots == (("slots", "k", n_slots),)
    assert step.bound == step.q_size * carry.catalog_width
    assert step.width <= step.bound
    assert step.width == step.bound  # one aliased region: every (extent, config) pair is reached
    bound = params["head"] + params["tail"]
    assert carry.demand_bytes == params["lead"] * bound * params["trail"] * BYTES[params["dtype"]]
    scratch = next(r for r in a.regions if r.name == "scratch")
    assert scratch.shape == (params["lead"], bound + params["stride"])


@settings(max_examples=25, deadline=None)
@given(contract_params)
def test_print_parse_round_trip(params):
    contract, diags = parse(render(params))
    assert not diags
    again, diags = parse(print_contract(contract))
    assert not diags
    assert again.model_dump() == contract.model_dump()


@settings(max_examples=8, deadline=None)
@given(contract_params, st.permutations(range(7)))
def test_compile_is_deterministic_black_stable_and_order_invariant(params, order):
    import black

    from duplexcadence.compiler.emit import BLACK_MODE

    text = render(params)
    assume(check_source(text, "prop.clock").ok)  # within the budget of 1000 classes
    first = compile_source(text, "prop.clock").files
    assert first == compile_source(text, "prop.clock").files
    for source in first.values():
        assert black.format_str(source, mode=BLACK_MODE) == source
    # reorder the independent top-level declarations (the header stays first)
    blocks = _blocks(text)
    header, rest = blocks[:2], blocks[2:]
    assert len(rest) == len(order)
    shuffled = "\n".join(header + [rest[i] for i in order])
    reordered = compile_source(shuffled, "prop.clock")
    assert reordered.ok, reordered.diagnostics
    assert _without_source_hash(reordered.files) == _without_source_hash(first)


def _without_source_hash(files):
    """The source text differs when reordered, so its sha256 does; nothing else may."""
    return {
        name: "\n".join(line for line in text.splitlines() if "sha256" not in line.lower())
        for name, text in files.items()
    }


def _blocks(text):
    """Split a contract into top-level declarations (a block runs to its closing brace)."""
    blocks, current, depth = [], [], 0
    for line in text.strip().splitlines():
        current.append(line)
        depth += line.count("{") - line.count("}")
        if depth == 0:
            blocks.append("\n".join(current))
            current = []
    return blocks


def test_shipped_contracts_round_trip():
    """Every construct the shipped contracts use (strides, none, flush-free attended,
    envelopes, constants) prints and parses back to the same IR."""
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    paths = sorted((root / "contracts").glob("*.clock")) + sorted(
        (root / "tests" / "golden").glob("*/contract.clock")
    )
    assert len(paths) >= 3
    for path in paths:
        contract, diags = parse(path.read_text())
        assert not diags, path
        again, diags = parse(print_contract(contract))
        assert not diags, path
        assert again.model_dump() == contract.model_dump(), path


@given(
    rows=st.integers(1, 6), cols=st.integers(1, 6), pad=st.integers(0, 40), offset=st.integers(0, 5)
)
def test_staging_reserve_counts_the_strided_span(rows, cols, pad, offset):
    # eq. (6)'s staging term is the static buffer the runtime allocates: a strided view
    # stages everything its strides reach, plus its offset, not just its elements
    row_stride = cols + pad
    source = f"""
contract spans
clock frame = 1 per call
callable step {{
  site model.step
  per frame
  arg x: float32 [{rows}, {cols}] strides [{row_stride}, 1] offset {offset}
}}
"""
    result = check_source(source, "spans.clock")
    assert result.analysis is not None, result.diagnostics
    [k] = result.analysis.callables
    span = 1 + (rows - 1) * row_stride + (cols - 1)
    assert k.staging_bytes == (offset + span) * 4
