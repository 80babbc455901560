"""`clockc`: check and compile `.clock` contracts.

Exit status: 0 success (warnings allowed), 1 user errors or generated drift,
2 usage errors (argparse). User errors are diagnostics, never tracebacks.
"""

from __future__ import annotations

import argparse
import difflib
import json
import sys
from pathlib import Path

from duplexcadence.compiler.driver import Result, compiler_version, read_and_compile
from duplexcadence.compiler.report import analysis_json, analysis_tables
from duplexcadence.dsl.diagnostics import Diagnostic, render

DEFAULT_CONTRACTS = "contracts"
DEFAULT_OUTPUT = "generated"


def _contracts(files: list[str]) -> list[Path]:
    if files:
        return [Path(f) for f in files]
    return sorted(Path(DEFAULT_CONTRACTS).glob("*.clock"))


def _diagnostics_json(r: Result) -> list[dict]:
    return [d.to_json(r.path) for d in sorted(r.diagnostics, key=Diagnostic.sort_key)]


def _print_diagnostics(r: Result) -> None:
    if r.diagnostics:
        print(render(r.diagnostics, r.path, r.source), file=sys.stderr)


def cmd_check(args) -> int:
    paths = _contracts(args.files)
    if not paths:
        print("clockc: no contracts given and none found under contracts/", file=sys.stderr)
        return 1
    results = [read_and_compile(p, emit=False) for p in paths]
    if args.format == "json":
        out = [
            {
                "path": r.path,
                "ok": r.ok,
                "diagnostics": _diagnostics_json(r),
                "analysis": analysis_json(r.analysis) if r.analysis else None,
            }
            for r in results
        ]
        print(json.dumps(out, indent=2, sort_keys=True))
    else:
        for r in results:
            _print_diagnostics(r)
            if r.analysis is not None:
                print(analysis_tables(r.analysis))
    return 0 if all(r.ok for r in results) else 1


def cmd_compile(args) -> int:
    paths = _contracts(args.files)
    if not paths:
        print("clockc: no contracts given and none found under contracts/", file=sys.stderr)
        return 1
    out_dir = Path(args.output)
    status = 0
    report = []
    for path in paths:
        r = read_and_compile(path, emit=True)
        entry = {
            "path": r.path,
            "ok": r.ok,
            "diagnostics": _diagnostics_json(r),
            "files": [],
            "drift": [],
        }
        if args.format != "json":
            _print_diagnostics(r)
        if not r.ok:
            status = 1
            report.append(entry)
            continue
        package = out_dir / r.contract.name
        for name, text in sorted(r.files.items()):
            target = package / name
            entry["files"].append(target.as_posix())
            if args.check:
                current = target.read_text(encoding="utf-8") if target.exists() else ""
                if current != text:
                    status = 1
                    entry["drift"].append(target.as_posix())
                    if args.format != "json":
                        sys.stdout.writelines(
                            difflib.unified_diff(
                                current.splitlines(keepends=True),
                                text.splitlines(keepends=True),
                                fromfile=f"a/{target.as_posix()}",
                                tofile=f"b/{target.as_posix()}",
                            )
                        )
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(text, encoding="utf-8")
        if args.format != "json":
            verb = "checked" if args.check else "wrote"
            state = "drift" if entry["drift"] else "ok"
            print(f"{verb} {package.as_posix()}/ ({len(r.files)} files) from {r.path}: {state}")
        report.append(entry)
    if args.format == "json":
        print(json.dumps(report, indent=2, sort_keys=True))
    return status


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="clockc",
        description="Check and compile native-clock contracts (.clock) into exact-replay adapters.",
    )
    parser.add_argument("--version", action="version", version=f"clockc {compiler_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    check = sub.add_parser(
        "check", help="report diagnostics and the analysis (catalogs, memory plan)"
    )
    check.add_argument(
        "files", nargs="*", metavar="FILE", help="contracts (default: contracts/*.clock)"
    )
    check.add_argument("--format", choices=("text", "json"), default="text")
    check.set_defaults(func=cmd_check)

    comp = sub.add_parser("compile", help="generate adapter packages under generated/<contract>/")
    comp.add_argument(
        "files", nargs="*", metavar="FILE", help="contracts (default: contracts/*.clock)"
    )
    comp.add_argument(
        "-o",
        "--output",
        default=DEFAULT_OUTPUT,
        metavar="DIR",
        help="output folder (default: generated)",
    )
    comp.add_argument(
        "--check",
        action="store_true",
        help="write nothing; print a diff and exit 1 if generated/ is stale",
    )
    comp.add_argument("--format", choices=("text", "json"), default="text")
    comp.set_defaults(func=cmd_compile)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
