"""Session parameters in the compiler: syntax, domain and linearity rules, the catalog
and the bytes as functions of the value (compiler/params.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from duplexcadence.compiler.driver import check_source, compile_source
from duplexcadence.dsl.parser import parse
from duplexcadence.dsl.printer import print_contract

ROOT = Path(__file__).resolve().parents[1]

BASE = """\
contract toy
clock chunk = 1 per call
clock frame = 3 per chunk
{params}
const f_tail = 7 frame
region carry {{
  dtype float32
  dims [frame, 8]
  lifetime turn
  retention head(f_prompt) ++ tail(f_tail)
  attended from {start} by 3 frame until f_prompt + f_tail
  site state["cache"]
}}
region scratch {{
  dtype float32
  dims [frame, 8]
  lifetime operator
  envelope extent(carry) + 3 frame
  site net.scratch
}}
callable step {{
  site net.step
  arg x: float32 [{xdim}, 8]
  arg state["cache"]: region carry
  aliased carry
  writes scratch
  retains carry from result[1]["cache"]
}}
"""
PARAM = "param f_prompt in 2..8 frame default 4 capture {3, 6} hold 2"


def contract(params=PARAM, start="f_prompt", xdim="3"):
    return BASE.format(params=params, start=start, xdim=xdim)


def codes(text: str) -> list[str]:
    return [d.code for d in check_source(text, "x.clock").diagnostics]


def test_param_round_trips_through_the_printer():
    c, diags = parse(contract())
    assert not diags
    (p,) = c.params
    assert (p.lo, p.hi, p.unit, p.default, p.capture, p.hold) == (2, 8, "frame", 4, (3, 6), 2)
    again, _ = parse(print_contract(c))
    assert again.model_dump() == c.model_dump()


def test_catalog_and_bytes_are_functions_of_the_value():
    r = check_source(contract(), "x.clock")
    assert r.ok, r.diagnostics
    pa = r.params
    assert set(pa.points) == {"f_prompt=2", "f_prompt=3", "f_prompt=4", "f_prompt=6", "f_prompt=8"}
    # the same classes at every value, the carry's extents moving one for one
    assert {a.callables[0].width for a in pa.points.values()} == {4}
    assert pa.extent_shift == {"carry": (("f_prompt", 1),)}
    assert pa.retention_shift == {"carry": ((("f_prompt", 1),), ())}
    assert pa.points["f_prompt=2"].regions[0].attended == (2, 5, 8, 9)
    assert pa.points["f_prompt=8"].regions[0].attended == (8, 11, 14, 15)
    # allocated at the largest value: carry 8 + 7 frames, scratch 15 + 3
    assert pa.shapes == {"carry": (15, 8), "scratch": (18, 8)}
    summary = pa.summary()
    assert summary["allocated_per_session_bytes"] == 15 * 8 * 4
    assert summary["points"]["f_prompt=2"]["per_session_bytes"] == 9 * 8 * 4
    # the shape as a function of the value: the frame dim moves one for one
    assert pa.shape_shift == {
        "carry": ((("f_prompt", 1),), ()),
        "scratch": ((("f_prompt", 1),), ()),
    }
    # a lane at bind: the largest of the default (4) and the capture values (3, 6)
    assert pa.bind_shapes == {"carry": (13, 8), "scratch": (16, 8)}
    assert summary["lane_at_bind_bytes"] == (13 + 16) * 8 * 4
    assert summary["shape_shift"]["carry"] == {0: [["f_prompt", 1]]}


def test_a_lane_at_bind_without_a_capture_set_is_the_default_fold():
    """What a plain binding allocates is the default value's demand, byte for byte
    (what the contract allocated before it had parameters)."""
    r = check_source(contract(params="param f_prompt in 2..8 frame default 4"), "x.clock")
    assert r.ok, r.diagnostics
    at_default = r.params.points["f_prompt=4"]
    assert r.params.bind_shapes == {x.name: x.shape for x in at_default.regions}
    assert r.params.at_bind(r.analysis).demand_bytes == at_default.demand_bytes


def test_generated_code_declares_the_domain_and_shifts():
    r = compile_source(contract(), "x.clock")
    assert r.ok, r.diagnostics
    code = r.files["contract.py"]
    assert "ParamDecl(" in code and "lo=2, hi=8, default=4, capture=(3, 6), hold=2" in code
    assert '"shift": (("f_prompt", 1),)' in code  # a RegionTable field
    assert '"shape_shift": ((("f_prompt", 1),), ())' in code  # per dim: the frame dim moves
    assert "(15, 8)" in code  # the carry at the domain's largest shape
    assert 'RegionView("carry", 4)' in code  # the catalog at the default


@pytest.mark.parametrize(
    "params, code",
    [
        ("param f_prompt in 8..2 frame", "CLK080"),
        ("param f_prompt in 2..8 frame default 9", "CLK080"),
        ("param f_prompt in 2..8 frame capture {1, 3}", "CLK080"),
        ("param f_prompt in 2..8 frame hold 0", "CLK080"),
        ("param f_prompt in 2..8 minute", "CLK080"),
        ("param f_prompt in 2..8 frame capture {2, 3, 4} hold 2", "CLK510"),
    ],
)
def test_bad_domains(params, code):
    assert code in codes(contract(params=params))


def test_a_parameter_must_stay_linear():
    assert "CLK081" in codes(contract(start="max(f_prompt, 3 frame)"))
    text = contract().replace(
        "const f_tail = 7 frame", "const f_tail = 7 frame\nconst sq = f_prompt * f_prompt"
    )
    assert "CLK081" in codes(text)


def test_a_parameter_may_not_move_a_staged_shape_or_the_width():
    assert "CLK082" in codes(contract(xdim="f_prompt"))
    # the window (bound - start) grows with the value: so would the catalog's width
    assert "CLK082" in codes(contract(start="3 frame"))


def test_a_read_region_may_grow_only_along_its_extent():
    text = contract().replace(
        "dims [frame, 8]\n  lifetime turn", "dims [frame, f_prompt]\n  lifetime turn"
    )
    assert "CLK082" in codes(text)


def test_an_unused_parameter_is_a_warning():
    text = contract(params=PARAM + "\nparam other in 1..3")
    assert "CLK511" in codes(text)


def test_token2wav_contract_reports_every_prompt_from_50_to_600():
    text = (ROOT / "contracts" / "stepaudio2_token2wav.clock").read_text()
    r = check_source(text, "contracts/stepaudio2_token2wav.clock")
    assert r.ok, r.diagnostics
    pa = r.params
    for label in ("f_prompt=50", "f_prompt=302", "f_prompt=600"):
        widths = {k.name: k.width for k in pa.points[label].callables}
        assert widths == {"flow_chunk": 12, "vocoder": 4}
    assert pa.points["f_prompt=50"].regions[0].attended == (50, 100, 150)
    assert pa.shapes["estimator_carry"][4] == 700 and pa.shapes["solver_workspace"][4] == 756
