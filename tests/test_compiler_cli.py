"""The clockc CLI as a user drives it: check, compile, --check drift, JSON, help."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from duplexcadence.compiler.cli import main

ROOT = Path(__file__).resolve().parent.parent
CONTRACTS = sorted((ROOT / "contracts").glob("*.clock"))


def test_shipped_contracts_check_clean(capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    assert main(["check"]) == 0
    out = capsys.readouterr()
    assert "error" not in out.err
    assert "flow_chunk" in out.out and "lm_step" in out.out


def test_check_json_token2wav_numbers(capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    assert main(["check", "contracts/stepaudio2_token2wav.clock", "--format", "json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["schema_version"] == 1 and document["command"] == "check"
    [entry] = document["contracts"]
    a = entry["analysis"]
    regions = {r["name"]: r for r in a["regions"]}
    assert regions["estimator_carry"]["attended"] == [302, 352, 402]
    assert regions["estimator_carry"]["catalog_width"] == 3
    assert regions["solver_workspace"]["shape"] == [10, 16, 2, 8, 458, 128]
    assert regions["solver_workspace"]["rho"] == pytest.approx(16 * 1000 / (10 * 458), abs=1e-3)
    calls = {k["name"]: k for k in a["callables"]}
    # 3 extents x (steady chunk, final chunk) x 2 declared autocast states (float32, the
    # vendor default; float16)
    assert calls["flow_chunk"]["width"] == 12 and calls["flow_chunk"]["in_scope"]
    assert calls["flow_chunk"]["ambient_states"] == 2
    assert calls["vocoder"]["width"] == 4


def test_moshi_frame_graphs_width_one(capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    assert main(["check", "contracts/moshi.clock", "--format", "json"]) == 0
    [entry] = json.loads(capsys.readouterr().out)["contracts"]
    calls = {k["name"]: k for k in entry["analysis"]["callables"]}
    assert {name: k["width"] for name, k in calls.items()} == {
        "mimi_encode": 1,
        "lm_step": 1,
        "mimi_decode": 1,
    }
    lm = next(r for r in entry["analysis"]["regions"] if r["name"] == "lm_kv")
    assert lm["attended"] == [3000] and lm["catalog_width"] == 1


def test_generated_is_fresh(monkeypatch, capsys):
    """CI's guard: generated/ must be exactly what the contracts compile to."""
    monkeypatch.chdir(ROOT)
    assert main(["compile", "--check"]) == 0, capsys.readouterr().out


def test_compile_check_reports_drift(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    out = tmp_path / "gen"
    shutil.copytree(ROOT / "generated", out)
    target = out / "moshi" / "contract.py"
    target.write_text(target.read_text().replace("3000", "3001"))
    assert main(["compile", "--check", "-o", str(out)]) == 1
    diff = capsys.readouterr().out
    assert "-" in diff and "3001" in diff and "drift" in diff
    # --check never writes
    assert "3001" in target.read_text()


def test_compile_writes_packages_json(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    assert main(["compile", "-o", str(tmp_path), "--format", "json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["schema_version"] == 1 and document["command"] == "compile"
    report = document["contracts"]
    assert {Path(r["path"]).name for r in report} == {p.name for p in CONTRACTS}
    for name in ("moshi", "stepaudio2_token2wav"):
        files = sorted(p.name for p in (tmp_path / name).iterdir())
        assert files == ["__init__.py", "adapter.py", "contract.py"]
        header = (tmp_path / name / "adapter.py").read_text().splitlines()[:2]
        assert "DO NOT EDIT" in header[0] and "sha256:" in header[0] and header[1] == "# @generated"


def test_compile_error_writes_nothing(tmp_path, capsys):
    bad = Path(__file__).parent / "errors" / "unknown_const.clock"
    assert main(["compile", str(bad), "-o", str(tmp_path)]) == 1
    assert list(tmp_path.iterdir()) == []
    assert "error[CLK011]" in capsys.readouterr().err


def test_unreadable_file_is_a_diagnostic(tmp_path, capsys):
    assert main(["check", str(tmp_path / "missing.clock")]) == 1
    assert "error[CLK005]: cannot read contract" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv", [["--help"], ["check", "--help"], ["compile", "--help"], ["--version"]]
)
def test_help_and_version(argv):
    proc = subprocess.run(
        [sys.executable, "-m", "duplexcadence.compiler.cli", *argv], capture_output=True, text=True
    )
    assert proc.returncode == 0
    assert ("usage:" in proc.stdout) or proc.stdout.startswith("clockc ")


def test_usage_error_exit_2():
    proc = subprocess.run(
        [sys.executable, "-m", "duplexcadence.compiler.cli", "frobnicate"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr


# ---------------------------------------------------------------- the frictions of issue 12
def test_explain(capsys):
    assert main(["--explain", "CLK020"]) == 0
    assert capsys.readouterr().out.startswith("CLK020 (error): unbounded or empty retention")
    assert main(["--explain"]) == 0
    listing = capsys.readouterr().out
    assert "CLK001" in listing and "CLK505" in listing
    assert main(["--explain", "CLK999"]) == 2
    assert capsys.readouterr().err.startswith("clockc: unknown diagnostic code")


def test_no_command_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_:
        main([])
    assert exit_.value.code == 2


def test_directory_argument_expands_to_its_contracts(capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    assert main(["check", "contracts", "--format", "json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert [e["path"] for e in document["contracts"]] == [
        p.relative_to(ROOT).as_posix() for p in CONTRACTS
    ]


def test_no_contracts_found_is_exit_2(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["check"]) == 2
    assert "no contracts given and none found" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["check", "empty"]) == 2
    assert "no .clock files in folder empty" in capsys.readouterr().err


def test_file_errors_have_no_position_and_no_exception_names(tmp_path, capsys):
    missing = tmp_path / "missing.clock"
    assert main(["check", str(missing)]) == 1
    err = capsys.readouterr().err
    assert (
        err.strip() == f"{missing}: error[CLK005]: cannot read contract: no such file or directory"
    )


def test_paths_outside_the_current_folder_are_shown_as_given(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    bad = tmp_path / "outside.clock"
    bad.write_text("contract c\nregion r {\n  dims [1]\n}\n")
    assert main(["check", str(bad)]) == 1
    assert capsys.readouterr().err.startswith(f"{bad}:2:8: error[CLK025]")


def test_compile_outside_a_project_needs_o(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    contract = ROOT / "tests/golden/streaming_cache/contract.clock"
    assert main(["compile", str(contract)]) == 2
    assert "pass -o DIR" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
    assert main(["compile", str(contract), "-o", "out"]) == 0
    assert (tmp_path / "out" / "streaming_cache" / "adapter.py").exists()


def test_check_tables_have_a_legend(capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    assert main(["check", "contracts/moshi.clock"]) == 0
    out = capsys.readouterr().out
    for term in ("legend:", "  s ", "  W ", "  K ", "  rho ", "  reserve "):
        assert term in out


@pytest.mark.parametrize("package", ["lark", "jinja2", "pydantic", "black"])
def test_clockc_without_the_compile_extra_says_what_to_install(package):
    """Only the runtime installed: one line naming the package and the extra, exit 2."""
    script = (
        "import sys\n"
        f"sys.modules[{package!r}] = None  # as if not installed\n"
        "from duplexcadence.compiler.cli import main\n"
        "sys.exit(main(['check']))\n"
    )
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT)
    assert run.returncode == 2
    assert run.stdout == ""
    assert run.stderr.strip().splitlines() == [
        f"clockc: the compiler needs {package}, which is not installed: "
        "pip install 'duplexcadence[compile]'"
    ]


def test_version_help_and_a_closed_pipe_need_no_compiler_and_print_no_traceback():
    """A runtime-only install (no lark) still answers --version; a reader that goes away
    (`clockc check | head -1`) gets no BrokenPipeError traceback."""
    no_lark = "import sys; sys.modules['lark'] = None; from duplexcadence.compiler import cli; "
    v = subprocess.run(
        [sys.executable, "-c", no_lark + "sys.exit(cli.main(['--version']))"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert v.returncode == 0 and v.stdout.startswith("clockc ") and not v.stderr
    c = subprocess.run(
        [sys.executable, "-c", no_lark + "sys.exit(cli.main(['check']))"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert c.returncode == 2 and "pip install 'duplexcadence[compile]'" in c.stderr
    piped = subprocess.run(
        f"{sys.executable} -m duplexcadence.compiler.cli check contracts | head -1",
        shell=True, capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1],
    )  # fmt: skip
    assert piped.stdout.strip() and "Traceback" not in piped.stderr
