"""Error goldens: every malformed contract in tests/errors/ gives exactly its diagnostics.

Rebuild the goldens with `UPDATE_GOLDEN=1 pytest tests/test_compiler_errors.py`.
"""

import os
from pathlib import Path

import pytest

from duplexcadence.compiler.cli import main
from duplexcadence.compiler.driver import check_source
from duplexcadence.dsl.diagnostics import render

ERRORS = Path(__file__).parent / "errors"
CASES = sorted(ERRORS.glob("*.clock"))


def test_corpus_is_large_enough():
    assert len(CASES) >= 20


@pytest.mark.parametrize("case", CASES, ids=lambda p: p.stem)
def test_error_golden(case: Path):
    source = case.read_text()
    result = check_source(source, f"errors/{case.name}")
    text = render(result.diagnostics, result.path, source) + "\n"
    golden = case.with_suffix(".expected")
    if os.environ.get("UPDATE_GOLDEN"):
        golden.write_text(text)
    assert text == golden.read_text()
    assert result.diagnostics, "a malformed contract must produce a diagnostic"
    # never a Python traceback or a lark-internal terminal name
    for word in ("Traceback", "__ANON", "LBRACE", "RBRACE", "$END", "Token("):
        assert word not in text


def test_several_errors_reported_in_one_run():
    source = (ERRORS / "several_errors_at_once.clock").read_text()
    result = check_source(source, "x.clock")
    codes = sorted(d.code for d in result.diagnostics)
    assert codes == ["CLK011", "CLK011", "CLK011", "CLK026"]
    lines = [d.span.line for d in sorted(result.diagnostics, key=lambda d: d.sort_key())]
    assert lines == sorted(lines)


def test_cli_exit_status_and_stderr(capsys):
    assert main(["check", str(ERRORS / "clock_cycle.clock")]) == 1
    err = capsys.readouterr().err
    assert "error[CLK013]: cycle among derived clocks" in err
    assert "^" in err


def test_warning_does_not_fail(capsys):
    assert main(["check", str(ERRORS / "lm_backbone_unit_stride.clock")]) == 0
    captured = capsys.readouterr()
    assert "warning[CLK501]" in captured.err
    assert "catalog width 2001 exceeds budget 64" in captured.err


def test_compiler_knows_the_runtime_determinism_settings():
    """The compiler validates settings without importing torch; the lists must agree."""
    from duplexcadence.compiler.validate import KNOWN_SETTINGS as compiler_side
    from duplexcadence.runtime import KNOWN_SETTINGS as runtime_side

    assert compiler_side == runtime_side
