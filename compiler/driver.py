"""The compile pipeline for one contract: text -> IR -> checks -> analysis -> files.

Each stage stops the pipeline only when the previous one found errors, so one run
reports every problem it can. Nothing here prints; the CLI presents the result.

Reading a contract is bounded: only regular files (never a device, a pipe or a
directory, whatever a link points to), at most `MAX_SOURCE_BYTES`, UTF-8. The
generated header names the contract independently of the current directory and
of what is installed: by its path relative to the folder that holds the output
folder (`contracts/x.clock` for `generated/`), else by its file name, escaped so
no file name can put a line break into generated code.
"""

from __future__ import annotations

import hashlib
import stat
from dataclasses import dataclass, field
from pathlib import Path

from duplexcadence.compiler import __version__
from duplexcadence.compiler.analysis import Analysis, analyse
from duplexcadence.compiler.emit import render_package
from duplexcadence.compiler.lower import lower
from duplexcadence.compiler.params import ParamAnalysis, analyse_params
from duplexcadence.compiler.stock_rules import stock_problem, stock_span
from duplexcadence.compiler.validate import Checked, validate
from duplexcadence.dsl import ir
from duplexcadence.dsl.diagnostics import Diagnostic, error, has_errors, shown_path, warning
from duplexcadence.dsl.parser import parse

MAX_SOURCE_BYTES = 1 << 20


def compiler_version() -> str:
    return __version__


@dataclass
class Result:
    path: str
    source: str
    contract: ir.Contract | None = None
    checked: Checked | None = None
    analysis: Analysis | None = None
    params: ParamAnalysis | None = None  # the folds over the session parameters' domains
    diagnostics: list[Diagnostic] = field(default_factory=list)
    files: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not has_errors(self.diagnostics)


def header_name(path: Path, output: Path | None) -> str:
    """How the generated header names the contract (see the module docstring)."""
    name = path.name
    if output is not None:
        try:
            name = path.resolve().relative_to(output.resolve().parent).as_posix()
        except (OSError, ValueError, RuntimeError):
            pass
    return shown_path(name)


def check_source(source: str, path: str) -> Result:
    result = Result(path=path, source=source)
    contract, diags = parse(source)
    result.diagnostics.extend(diags)
    if contract is None:  # a syntax error: nothing to validate
        return result
    result.contract = contract
    checked, diags = validate(contract)
    result.diagnostics.extend(diags)
    if has_errors(result.diagnostics):
        return result
    result.checked = checked
    result.analysis, problems = analyse(checked)
    result.diagnostics.extend(problems)
    for k, ka in zip(contract.callables, result.analysis.callables):
        # (the budget counts graphs: one per class and batch width)
        if ka.in_scope or k.mode == "eager" and ka.graphs <= checked.budget:
            continue
        if problems and not ka.in_scope and ka.graphs <= checked.budget and k.mode == "replay":
            continue  # out of scope only because its evaluation failed: reported above
        span = k.prop_spans.get("mode", k.span)
        if k.mode == "eager":
            result.diagnostics.append(
                warning(
                    "CLK501",
                    f"callable '{k.name}' is out of lossless scope and left eager: {ka.scope_reason}",
                    span,
                )
            )
        else:
            result.diagnostics.append(
                error(
                    "CLK030",
                    f"callable '{k.name}': {ka.scope_reason}; out of lossless scope — "
                    "declare `mode eager` to leave it eager",
                    span,
                )
            )
    if contract.params and not has_errors(result.diagnostics):
        result.params, problems = analyse_params(contract, checked, result.analysis)
        result.diagnostics.extend(problems)
    nodes = {x.name: x for x in contract.regions}
    for r in result.analysis.regions:
        problem = stock_problem(nodes[r.name], r, checked.regions[r.name])
        if problem is not None:  # (at the other parameter values: CLK083, params.py)
            result.diagnostics.append(error("CLK031", problem, stock_span(nodes[r.name])))
    return result


def compile_source(source: str, path: str, *, source_name: str | None = None) -> Result:
    """Check and generate. The header names the contract `source_name` (escaped),
    by default `path`."""
    result = check_source(source, path)
    if not result.ok:
        return result
    context = lower(
        result.checked,
        result.analysis,
        param_analysis=result.params,
        compiler_version=compiler_version(),
        source_name=shown_path(source_name if source_name is not None else path),
        source_sha256=hashlib.sha256(source.encode()).hexdigest(),
    )
    result.files = render_package(context)
    return result


def read_contract(path: Path) -> tuple[str | None, Diagnostic | None]:
    """The contract text, or the one diagnostic saying why it cannot be read."""

    def cannot(why: str, code: str = "CLK005") -> tuple[None, Diagnostic]:
        return None, error(code, f"cannot read contract: {why}")

    try:
        info = path.stat()  # follows links: what matters is what the link points to
    except (OSError, ValueError) as exc:
        return cannot(_reason(exc))
    if stat.S_ISDIR(info.st_mode):
        return cannot("it is a directory")
    if not stat.S_ISREG(info.st_mode):
        return cannot("not a regular file (a device, a pipe or a socket)")
    if info.st_size > MAX_SOURCE_BYTES:
        return cannot(f"{info.st_size} bytes; at most {MAX_SOURCE_BYTES} are read", "CLK006")
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_SOURCE_BYTES + 1)
    except (OSError, ValueError) as exc:
        return cannot(_reason(exc))
    if len(data) > MAX_SOURCE_BYTES:
        return cannot(f"more than {MAX_SOURCE_BYTES} bytes", "CLK006")
    try:
        return data.decode("utf-8"), None
    except UnicodeDecodeError as exc:
        return cannot(f"not UTF-8 text (byte {exc.start} is {data[exc.start]:#04x})")


def _reason(exc: Exception) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror.lower()
    return "invalid path" if isinstance(exc, ValueError) else "cannot be opened"


def read_and_compile(path: Path, *, emit: bool, output: Path | None = None) -> Result:
    """Check (or check and generate) the contract at `path`; diagnostics name the
    path as given. `output` is the folder the package goes to (for the header)."""
    shown = path.as_posix()
    source, problem = read_contract(path)
    if problem is not None:
        return Result(path=shown, source="", diagnostics=[problem])
    if not emit:
        return check_source(source, shown)
    return compile_source(source, shown, source_name=header_name(path, output))
