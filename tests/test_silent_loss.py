"""Issue 13's table of likely mistakes, the rows `clockc check` and `bind()` catch.

Each mistake is made on the tiny model's hand-written contract (tests/tiny_draft_model.py),
which checks clean and replays 20/20 chunks exactly. Rows caught by `clockc check` give a
positioned warning (CLK506, CLK507, CLK508, CLK509); a misspelled carry site is refused by
`bind()` with the site named and the nearest existing name. The rows about retention
values, keyword calls and layouts belong to `clockc verify` and the runtime.
"""

import torch
import pytest
from fuzzing import import_package
from tiny_draft_model import CONTRACT, build, drive

from duplexcadence.compiler.driver import check_source, read_and_compile
from duplexcadence.runtime import FakeGraphBackend, SiteError


def _diagnostics(text: str) -> list[tuple[str, int, int, str]]:
    r = check_source(text, "tiny.clock")
    return [(d.code, d.span.line, d.span.column, d.message) for d in r.diagnostics]


def _line_of(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


def test_the_hand_written_contract_checks_clean():
    assert _diagnostics(CONTRACT) == []


def test_no_attended_line_warns_at_the_retention():
    text = CONTRACT.replace("  attended from 0 frame by 4 frame until keep\n", "", 1)
    (diag,) = _diagnostics(text)
    code, line, column, message = diag
    assert code == "CLK507" and line == _line_of(text, "retention window(keep)")
    assert column == 3 and "'kv0'" in message and "only its full extent 16" in message


def test_attended_stride_off_the_chunk_advance_warns_at_the_stride():
    text = CONTRACT.replace("by 4 frame until keep", "by 3 frame until keep", 1)
    (diag,) = _diagnostics(text)
    code, line, column, message = diag
    assert code == "CLK506"
    assert (line, column) == (
        _line_of(text, "by 3 frame"),
        text.splitlines()[line - 1].index("3 frame") + 1,
    )
    assert (
        "stride 3 of region 'kv0'" in message
        and "'step' appends per call: 4 frame per chunk" in message
    )


def test_header_only_contract_warns():
    (diag,) = _diagnostics("contract empty\n")
    assert diag[:3] == ("CLK509", 1, 1) and "declares no callable" in diag[3]


def test_declared_only_regions_are_listed_in_one_warning():
    text = CONTRACT.replace('  site state["kv1"]\n', "").replace("  arg kv1: region kv1\n", "")
    text = text.replace("aliased kv0, kv1", "aliased kv0").replace(
        "  retains kv1 from result[3]\n", ""
    )
    text += "region spare {\n  dtype float32\n  dims [4]\n}\n"
    (diag,) = _diagnostics(text)
    code, line, _, message = diag
    assert code == "CLK508" and line == _line_of(text, "region kv1")
    assert f"kv1 (line {line}), spare (line {_line_of(text, 'region spare')})" in message


def test_a_region_documented_on_purpose_is_not_warned_about():
    text = CONTRACT.replace('  site state["kv1"]\n', "").replace("  arg kv1: region kv1\n", "")
    text = text.replace("aliased kv0, kv1", "aliased kv0").replace(
        "  retains kv1 from result[3]\n", ""
    )
    text = text.replace("region kv1 {\n", "region kv1 {\n  allocate none\n")
    assert _diagnostics(text) == []


def test_warnings_wait_for_a_valid_contract():
    # an error elsewhere: the contract is reported by its error, not by follow-on warnings
    text = CONTRACT.replace("by 4 frame until keep", "by 3 frame until 12 frame", 1)
    assert [d[0] for d in _diagnostics(text)] == ["CLK022"]


def _adapter(tmp_path, text):
    path = tmp_path / "tiny.clock"
    path.write_text(text)
    r = read_and_compile(path, emit=True, output=tmp_path / "gen")
    assert r.ok, r.diagnostics
    return import_package(r.files)[1]


@pytest.mark.parametrize(
    "site, suggestion",
    [
        ('state["kv_1"]', "no item 'kv_1' (did you mean 'kv1'?)"),
        ('stat["kv1"]', "(did you mean 'state'?)"),
    ],
)
def test_misspelled_carry_site_is_refused_at_bind_with_the_nearest_name(tmp_path, site, suggestion):
    adapter = _adapter(tmp_path, CONTRACT.replace('site state["kv1"]', f"site {site}"))
    model = build()
    before = dict(model.state)
    with pytest.raises(SiteError) as refused:
        adapter.bind(model, device="cpu", progress=False)
    message = str(refused.value)
    assert (
        f"kv1 at {site}" in message and suggestion in message and "nothing was changed" in message
    )
    assert model.state == before and "step" not in vars(model)


def test_carry_site_absent_before_priming_is_checked_at_capture(tmp_path):
    adapter = _adapter(tmp_path, CONTRACT)
    model = build()
    state = model.state
    del model.state  # bound before the stock state exists (Token2Wav's before_priming)
    binding = adapter.bind(model, device="cpu", capture=False, backend=FakeGraphBackend())
    with pytest.raises(SiteError, match=r"kv0 at state\[\"kv0\"\]"):
        binding.capture(progress=False)
    model.state = state
    binding.capture(progress=False)
    binding.unbind()


def test_the_hand_written_contract_replays_every_chunk_exactly(tmp_path):
    adapter = _adapter(tmp_path, CONTRACT)
    stock = list(drive(build(), 20))
    model = build()
    binding = adapter.bind(model, device="cpu", backend=FakeGraphBackend(), progress=False)
    binding.capture(progress=False)
    got = list(drive(model, 20))
    assert all(torch.equal(a, b) for a, b in zip(got, stock)) and len(got) == 20
    assert binding.stats()["callables"]["step"]["hits"] == 20
    binding.unbind()
