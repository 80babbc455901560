"""Structure that keeps one fact in one place: layering, the code registry, the
reserved names, the version.

* dsl/ imports nothing from compiler/ (the IR and its printer live beside the parser);
  the runtime imports neither.
* Every code the sources report is registered in dsl/codes.py, with the severity it is
  reported at, and the language reference's table is exactly the registry's.
* Every identifier the templates write is in compiler/names.GENERATED_NAMES (or derived
  from a contract name), so a contract name can never shadow one.
* The version in generated headers is pyproject.toml's.
* No function in compiler/ is over 80 lines.
"""

import ast
import os
import re
import tomllib
from pathlib import Path

import pytest

from duplexcadence.compiler import __version__
from duplexcadence.compiler.driver import compile_source
from duplexcadence.compiler.names import DERIVED_PREFIXES, DERIVED_SUFFIXES, GENERATED_NAMES
from duplexcadence.dsl.codes import CODES, explain, markdown_table
from duplexcadence.dsl.mistakes import MISTAKES
from duplexcadence.dsl.parser import parse

ROOT = Path(__file__).resolve().parent.parent


def _imports(folder: str) -> set[str]:
    found = set()
    for path in (ROOT / folder).glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                found.add(node.module)
            elif isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
    return found


def test_layering_is_one_way():
    assert not {m for m in _imports("dsl") if m.startswith("duplexcadence.compiler")}
    runtime = _imports("runtime")
    assert not {m for m in runtime if m.startswith(("duplexcadence.compiler", "duplexcadence.dsl"))}
    # the lowest modules of dsl import nothing of the project
    for name in ("codes", "diagnostics"):
        text = (ROOT / "dsl" / f"{name}.py").read_text()
        assert "duplexcadence.compiler" not in text


def _reported_codes() -> dict[str, set[str]]:
    """code -> severities it is reported at, read from the sources."""
    found: dict[str, set[str]] = {}
    pattern = re.compile(r"\b(error|warning|err|warn)\(\s*\"(CLK\d{3})\"")
    for folder in ("dsl", "compiler"):
        for path in (ROOT / folder).glob("*.py"):
            for kind, code in pattern.findall(path.read_text()):
                found.setdefault(code, set()).add("warning" if "warn" in kind else "error")
            for code in re.findall(r"EvalError\(\s*\"(CLK\d{3})\"", path.read_text()):
                found.setdefault(code, set()).add("error")
    for code, _, _ in MISTAKES:
        found.setdefault(code, set()).add("error")
    return found


def test_every_reported_code_is_registered_with_its_severity():
    reported = _reported_codes()
    assert len(reported) >= 40
    for code, severities in reported.items():
        assert code in CODES, f"{code} is reported but not registered"
        assert severities == {CODES[code].severity}, code
    literals = set()
    for folder in ("dsl", "compiler"):
        for path in (ROOT / folder).glob("*.py"):
            if path.name != "codes.py":
                literals.update(re.findall(r"\"(CLK\d{3})\"", path.read_text()))
    assert literals <= set(CODES), sorted(literals - set(CODES))
    unused = set(CODES) - literals - set(reported)
    assert not unused, f"registered but never reported: {sorted(unused)}"


def test_readme_table_is_the_registry():
    """The language reference's table of codes (docs/language.md) is the registry.
    Rebuild it with `UPDATE_GOLDEN=1 pytest tests/test_compiler_structure.py`."""
    path = ROOT / "docs" / "language.md"
    readme = path.read_text()
    begin = readme.index("<!-- codes:begin")
    begin = readme.index("\n", begin) + 1
    end = readme.index("<!-- codes:end -->")
    if os.environ.get("UPDATE_GOLDEN"):
        path.write_text(readme[:begin] + markdown_table() + readme[end:])
        readme = path.read_text()
        end = readme.index("<!-- codes:end -->")
    assert readme[begin:end] == markdown_table()


def test_explain():
    assert explain("clk020").startswith("CLK020 (error): unbounded or empty retention")
    assert explain("CLK999") is None


def test_every_mistake_example_is_recognised_as_its_code():
    for code, hint, examples in MISTAKES:
        for text in examples:
            _, diagnostics = parse(text)
            assert [d.code for d in diagnostics] == [code], text
            assert hint in diagnostics[0].message


def test_a_mistake_code_needs_its_token_not_only_its_state():
    # `dtype` followed by a misspelt dtype is not "a property with '='"
    _, diagnostics = parse("contract c\nregion r {\n  dtype flaot32\n}\n")
    assert [d.code for d in diagnostics] == ["CLK001"]


def _generated_identifiers(source: str) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.alias):
            names.add(node.asname or node.name.split(".")[0])
    return names


CONTRACTS = sorted((ROOT / "contracts").glob("*.clock")) + sorted(
    (ROOT / "tests" / "golden").glob("*/contract.clock")
)


@pytest.mark.parametrize("path", CONTRACTS, ids=lambda p: p.parent.name + "/" + p.name)
def test_generated_identifiers_are_all_reserved(path):
    result = compile_source(path.read_text(), path.name)
    c = result.contract
    own = {x.name for x in (*c.regions, *c.callables, *c.constants)}
    for source in result.files.values():
        for name in _generated_identifiers(source) - own - GENERATED_NAMES:
            derived = name.startswith(DERIVED_PREFIXES) or name.endswith(DERIVED_SUFFIXES)
            assert derived, f"{name!r} is written by the templates but not reserved (names.py)"


def test_version_is_pyprojects():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["version"] == __version__


def test_no_compiler_function_is_over_80_lines():
    """House style (DESIGN.md §7): small functions of one step each."""
    long = []
    for path in sorted((ROOT / "compiler").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > 80:
                    long.append(f"{path.name}:{node.lineno} {node.name} ({lines} lines)")
    assert not long, long
