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
  stock [32 frame, 8]
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
    assert 'RegionViews("carry", range(4, 13, 3), 11)' in code  # the catalog at the default


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


SCRATCH_STOCK = "  stock [32 frame, 8]\n  site net.scratch\n"


def scratch(lines: str) -> str:
    """The contract with the scratch region's stock and site lines replaced."""
    text = contract()
    assert SCRATCH_STOCK in text
    return text.replace(SCRATCH_STOCK, lines)


def diagnostics(text: str) -> list[tuple[str, int, str]]:
    """(code, line, message) of each error."""
    found = check_source(text, "x.clock").diagnostics
    return [(d.code, d.span.line, d.message) for d in found if d.severity == "error"]


def line_of(text: str, part: str) -> int:
    return next(i for i, line in enumerate(text.split("\n"), 1) if part in line)


def test_an_installed_region_growing_with_a_parameter_declares_its_stock():
    # bind() copies the stock tensor at the site into the region allocated at the
    # largest value (18 frames): without `stock` nothing says the tensor holds that
    text = scratch("  site net.scratch\n")
    ((code, line, message),) = diagnostics(text)
    assert (code, line) == ("CLK083", line_of(text, "site net.scratch"))
    assert "region 'scratch' changes shape with param 'f_prompt'" in message
    assert "(12, 8) at f_prompt=2, (18, 8) at f_prompt=8" in message
    # a region with no site is allocated and put nowhere: nothing is read
    assert codes(scratch("")) == []


def test_a_stock_constant_must_hold_the_largest_value_not_only_the_default():
    # 16 frames hold the default's 14 but not the 18 the region needs at the top
    text = scratch("  stock [16 frame, 8]\n  site net.scratch\n")
    ((code, line, message),) = diagnostics(text)
    assert (code, line) == ("CLK083", line_of(text, "stock [16 frame, 8]"))
    assert message.startswith("at f_prompt=8: region 'scratch' needs 576 bytes, more than")
    # too small for the default already: CLK031 alone, not twice
    text = scratch("  stock [12 frame, 8]\n  site net.scratch\n")
    assert codes(text) == ["CLK031"]
    assert codes(scratch("  stock [18 frame, 8]\n  site net.scratch\n")) == []


def test_a_stock_constant_must_hold_the_allocation_over_every_parameter():
    # two parameters grow the scratch: each point needs at most 15 frames, but the
    # region is allocated at 11 + 4 + 4 = 19 (each parameter's growth added)
    text = scratch("  stock [16 frame, 8]\n  site net.scratch\n")
    text = text.replace("envelope extent(carry) + 3 frame", "envelope extent(carry) + f_extra")
    text = text.replace(PARAM, PARAM + "\nparam f_extra in 0..4 frame")
    ((code, _, message),) = diagnostics(text)
    assert code == "CLK083"
    assert message.startswith("region 'scratch' is allocated at (19, 8), its largest shape")
    assert "its stock constant holds 16 along dim 0; bind() copies" in message
    # a stock constant that moves with a parameter: where it is smallest is named
    text = text.replace("stock [16 frame, 8]", "stock [22 frame - f_extra, 8]")
    ((code, _, message),) = diagnostics(text)
    assert code == "CLK083" and "holds 18 along dim 0 at f_extra=4;" in message


@pytest.mark.parametrize(
    "lines, says",
    [
        ("  address pinned\n  site net.scratch\n", "`address pinned`"),
        ('  address pinned\n  initial zeros\n  site pins["scratch"]\n', "`address pinned`"),
        (
            "  stock [f_prompt + 10 frame, 8]\n  allocate stock\n  site net.scratch\n",
            "`allocate stock`",
        ),
    ],
    ids=["pinned", "pinned_initial_zeros", "allocate_stock"],
)
def test_a_region_that_is_the_stock_tensor_cannot_change_shape_with_a_parameter(lines, says):
    found = diagnostics(scratch(lines))
    assert [c for c, _, _ in found] == ["CLK083"]
    message = next(m for c, _, m in found if c == "CLK083")
    assert f"region 'scratch' is the stock tensor at its site ({says})" in message
    assert "param 'f_prompt'" in message
    # the same regions with a shape that does not move are valid
    fixed = scratch(lines).replace("envelope extent(carry) + 3 frame", "envelope 18 frame")
    fixed = fixed.replace("f_prompt + 10 frame", "18 frame")
    assert [c for c in codes(fixed) if c != "CLK505"] == []


def test_a_carry_stock_is_checked_at_every_value():
    # the stock history shrinks as the retention grows: enough at the default (4 + 7 <= 16),
    # not at the top of the domain (8 + 7 > 12)
    text = contract().replace(
        '  site state["cache"]', '  stock [20 frame - f_prompt, 8]\n  site state["cache"]'
    )
    ((code, _, message),) = diagnostics(text)
    assert code == "CLK083"
    assert message.startswith("at f_prompt=8: region 'carry' needs 480 bytes")


def test_a_carry_history_off_its_axis_cannot_change_with_a_parameter():
    text = contract().replace(
        '  retains carry from result[1]["cache"]',
        '  retains carry from result[1]["cache"]\n  retains side from result[2]',
    )
    text += """region side {
  dtype float32
  dims [frame, f_prompt]
  lifetime turn
  retention ring(4 frame)
  site state["side"]
}
"""
    found = diagnostics(text)
    assert [c for c, _, _ in found] == ["CLK083"], found
    assert "carry 'side' adopts the stock history at its site" in found[0][2]


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
