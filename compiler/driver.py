"""The compile pipeline for one contract: text -> IR -> checks -> analysis -> files.

Each stage stops the pipeline only when the previous one found errors, so one run
reports every problem it can. Nothing here prints; the CLI presents the result.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from duplexcadence.compiler import ir
from duplexcadence.compiler.analysis import Analysis, analyse
from duplexcadence.compiler.emit import render_package
from duplexcadence.compiler.lower import lower
from duplexcadence.compiler.validate import Checked, validate
from duplexcadence.dsl.diagnostics import Diagnostic, error, has_errors, warning
from duplexcadence.dsl.parser import parse


def compiler_version() -> str:
    try:
        return version("duplexcadence")
    except PackageNotFoundError:  # running from a source tree without install
        return "0+unknown"


@dataclass
class Result:
    path: str
    source: str
    contract: ir.Contract | None = None
    checked: Checked | None = None
    analysis: Analysis | None = None
    diagnostics: list[Diagnostic] = field(default_factory=list)
    files: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not has_errors(self.diagnostics)


def display_name(path: Path) -> str:
    """The path as the header shows it: relative to cwd when inside it, else its name."""
    try:
        return path.resolve().relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        return path.name


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
    result.analysis = analyse(checked)
    for k, ka in zip(contract.callables, result.analysis.callables):
        if ka.in_scope or k.mode == "eager" and ka.width <= checked.budget:
            continue
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
    for r in result.analysis.regions:
        if r.stock_bytes is not None and r.demand_bytes > r.stock_bytes:
            region = next(x for x in contract.regions if x.name == r.name)
            result.diagnostics.append(
                error(
                    "CLK031",
                    f"region '{r.name}' needs {r.demand_bytes} bytes, more than its stock "
                    f"constant ({r.stock_bytes} bytes); a demand size cannot exceed the stock envelope",
                    region.prop_spans.get("stock", region.span),
                )
            )
    return result


def compile_source(source: str, path: str) -> Result:
    result = check_source(source, path)
    if not result.ok:
        return result
    context = lower(
        result.checked,
        result.analysis,
        compiler_version=compiler_version(),
        source_name=path,
        source_sha256=hashlib.sha256(source.encode()).hexdigest(),
    )
    result.files = render_package(context)
    return result


def read_and_compile(path: Path, *, emit: bool) -> Result:
    name = display_name(path)
    try:
        source = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        return Result(
            path=name,
            source="",
            diagnostics=[error("CLK005", f"cannot read contract: {exc.__class__.__name__}: {exc}")],
        )
    return compile_source(source, name) if emit else check_source(source, name)
