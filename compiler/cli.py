"""`clockc`: check, compile, plan and verify `.clock` contracts; draft one from a traced stream.

The commands that run a user's model (verify, draft, reproduce) live in cli_model.py.

Exit status: 0 success (warnings allowed), 1 user errors in a contract or generated
drift, 2 usage errors (bad arguments, no contracts found, an output folder that
cannot be written). User errors are diagnostics, never tracebacks; every other
failure is one line on stderr.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import sys
from pathlib import Path

from duplexcadence.compiler import __version__

# The [compile] extra: where only the runtime is installed, `clockc` names the missing
# package in one line (main(), exit 2) instead of failing on import with a traceback.
# `--version`, `--help` and `reproduce` (which reads no contract) work without it.
COMPILE_EXTRA = ("jinja2", "lark", "pydantic", "black")
NEEDS_NO_COMPILER = frozenset({"reproduce"})
try:
    from duplexcadence.compiler.driver import (
        Result,
        check_source,
        read_and_compile,
    )
    from duplexcadence.compiler.plan import footprint
    from duplexcadence.compiler.report import (
        LEGEND,
        analysis_json,
        analysis_tables,
        catalog_and_session,
        params_text,
    )
    from duplexcadence.dsl.codes import CODES, explain
    from duplexcadence.dsl.diagnostics import Diagnostic, render, shown_path
except ModuleNotFoundError as exc:
    if (exc.name or "").split(".")[0] not in COMPILE_EXTRA:
        raise
    MISSING_EXTRA: str | None = exc.name.split(".")[0]
else:
    MISSING_EXTRA = None

DEFAULT_CONTRACTS = "contracts"
DEFAULT_OUTPUT = "generated"
# Version of the `--format json` documents; raised when a field changes meaning.
JSON_SCHEMA_VERSION = 1


class UsageError(Exception):
    """A command line that cannot be carried out: one line, exit status 2."""


def _contracts(files: list[str]) -> list[Path]:
    """The contracts named on the command line (a folder stands for its *.clock
    files), or contracts/*.clock when none are named."""
    if not files:
        found = sorted(Path(DEFAULT_CONTRACTS).glob("*.clock"))
        if not found:
            raise UsageError("no contracts given and none found under contracts/")
        return found
    paths: list[Path] = []
    for f in files:
        p = Path(f)
        if p.is_dir():
            inside = sorted(p.glob("*.clock"))
            if not inside:
                raise UsageError(f"no .clock files in folder {shown_path(f)}")
            paths += inside
        else:
            paths.append(p)  # a missing or unreadable file is a diagnostic (CLK005)
    return paths


def _output_dir(option: str | None) -> Path:
    """The output folder: `-o DIR`, else generated/ where this is a contracts folder's
    project (it has contracts/ or generated/), never a stray ./generated/ elsewhere."""
    if option is None:
        if not (Path(DEFAULT_CONTRACTS).is_dir() or Path(DEFAULT_OUTPUT).is_dir()):
            raise UsageError(
                "no -o DIR given and this folder has neither contracts/ nor generated/; "
                "pass -o DIR to say where the generated package goes"
            )
        option = DEFAULT_OUTPUT
    if "\0" in option or not option:
        raise UsageError(f"-o {shown_path(option)!r} is not a usable folder name")
    out = Path(option)
    if out.exists() and not out.is_dir():
        raise UsageError(f"-o {shown_path(option)} exists and is not a folder")
    return out


def _document(command: str, entries: list[dict]) -> str:
    return json.dumps(
        {"schema_version": JSON_SCHEMA_VERSION, "command": command, "contracts": entries},
        indent=2,
        sort_keys=True,
    )


def _diagnostics_json(r: Result) -> list[dict]:
    return [d.to_json(r.path) for d in sorted(r.diagnostics, key=Diagnostic.sort_key)]


def _print_diagnostics(r: Result) -> None:
    if r.diagnostics:
        print(render(r.diagnostics, r.path, r.source), file=sys.stderr)


def cmd_check(args) -> int:
    results = [read_and_compile(p, emit=False) for p in _contracts(args.files)]
    if args.format == "json":
        out = [
            {
                "path": r.path,
                "ok": r.ok,
                "diagnostics": _diagnostics_json(r),
                "analysis": analysis_json(r.analysis) if r.analysis else None,
                "params": r.params.summary() if r.params else None,
            }
            for r in results
        ]
        print(_document("check", out))
    else:
        for r in results:
            _print_diagnostics(r)
            if r.analysis is not None:
                print(analysis_tables(r.analysis))
                if r.checked is not None:
                    fp = footprint(r.checked, r.analysis)
                    print(catalog_and_session(r.analysis, fp.per_session_bytes))
            if r.params is not None:
                print(params_text(r.params.summary()) + "\n")
        if any(r.analysis is not None for r in results):
            print(LEGEND)
    return 0 if all(r.ok for r in results) else 1


def _write(target: Path, text: str) -> None:
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot write {shown_path(target.as_posix())}: {_why(exc)}") from None


def _read_current(target: Path) -> str:
    """What --check compares against: the file's text, or "" where there is none."""
    try:
        return target.read_text(encoding="utf-8")
    except FileNotFoundError:
        return ""
    except (OSError, ValueError) as exc:
        return f"<unreadable: {_why(exc)}>\n"


def _why(exc: Exception) -> str:
    return exc.strerror.lower() if isinstance(exc, OSError) and exc.strerror else str(exc)


def cmd_compile(args) -> int:
    paths = _contracts(args.files)
    out_dir = _output_dir(args.output)
    status = 0
    report = []
    for path in paths:
        r = read_and_compile(path, emit=True, output=out_dir)
        entry = {"path": r.path, "ok": r.ok, "diagnostics": _diagnostics_json(r)}
        entry.update(files=[], drift=[])
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
            if not args.check:
                _write(target, text)
                continue
            current = _read_current(target)
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
        if args.format != "json":
            verb = "checked" if args.check else "wrote"
            state = "drift" if entry["drift"] else "ok"
            shown = shown_path(package.as_posix())
            print(f"{verb} {shown}/ ({len(r.files)} files) from {shown_path(r.path)}: {state}")
        report.append(entry)
    if args.format == "json":
        print(_document("compile", report))
    return status


def cmd_plan(args) -> int:
    """Bytes per session, lane and voice from the contract; with --profile, the sessions
    one GPU holds by memory and serves by time (compiler/plan.py)."""
    from duplexcadence.compiler.plan import Profile, footprint_json, plan_text, predict

    if args.arrivals is not None and not args.arrivals > 0:
        raise UsageError(f"--arrivals {args.arrivals:g}: seconds must be more than 0")
    profile = None
    if args.profile:
        try:
            doc = json.loads(Path(args.profile).read_text())
            profile = Profile.from_json(doc.get("profile", doc))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise UsageError(f"--profile {shown_path(args.profile)}: {_why(exc)}") from exc
    entries, ok = [], True
    for r in (read_and_compile(p, emit=False) for p in _contracts(args.files)):
        _print_diagnostics(r)
        if r.analysis is None or r.checked is None:
            ok = False
            continue
        # with session parameters: what a lane and a session allocate at bind (the default
        # and the capture values); each folded value's footprint follows
        fp = footprint(r.checked, r.params.at_bind(r.analysis) if r.params else r.analysis)
        lanes = args.lanes or (sorted(profile.chunks_per_s) if profile else [])
        try:
            preds = (
                [predict(fp, profile, k, args.voices, args.values, args.arrivals) for k in lanes]
                if profile
                else []
            )
        except KeyError as exc:
            raise UsageError(str(exc.args[0])) from exc
        entry = {"path": r.path, "footprint": footprint_json(fp), "predictions": preds}
        if r.params is not None:  # the footprint at each folded parameter value
            at = {label: footprint(r.checked, a) for label, a in r.params.points.items()}
            entry["params"] = r.params.summary()
            entry["params"]["footprints"] = {k: footprint_json(v) for k, v in at.items()}
        entries.append(entry)
        if args.format == "text":
            print(plan_text(fp, preds))
            if r.params is not None:
                print(params_text(r.params.summary(), at))
    if args.format == "json":
        print(_document("plan", entries))
    return 0 if ok else 1


def cmd_explain(code: str) -> int:
    if code.lower() == "all":
        for c in CODES.values():
            print(f"{c.code}  {c.severity:<7}  {c.title}")
        return 0
    text = explain(code)
    if text is None:
        raise UsageError(f"unknown diagnostic code {code!r}; `clockc --explain all` lists them")
    print(text, end="")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="clockc",
        description="Check and compile native-clock contracts (.clock) into exact-replay adapters.",
    )
    parser.add_argument("--version", action="version", version=f"clockc {__version__}")
    parser.add_argument(
        "--explain",
        nargs="?",
        const="all",
        metavar="CODE",
        help="explain a diagnostic code (e.g. CLK020); without CODE, list every code",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    files_help = "contracts or folders of them (default: contracts/*.clock)"

    check = sub.add_parser(
        "check", help="report diagnostics and the analysis (catalogs, memory plan)"
    )
    check.add_argument("files", nargs="*", metavar="FILE", help=files_help)
    check.add_argument("--format", choices=("text", "json"), default="text")
    check.set_defaults(func=cmd_check)

    comp = sub.add_parser("compile", help="generate adapter packages under generated/<contract>/")
    comp.add_argument("files", nargs="*", metavar="FILE", help=files_help)
    comp.add_argument(
        "-o",
        "--output",
        default=None,
        metavar="DIR",
        help="output folder (default: generated/, only where ./contracts/ or ./generated/ exists)",
    )
    comp.add_argument(
        "--check",
        action="store_true",
        help="write nothing; print a diff and exit 1 if the output folder is stale",
    )
    comp.add_argument("--format", choices=("text", "json"), default="text")
    comp.set_defaults(func=cmd_compile)

    plan = sub.add_parser(
        "plan", help="capacity plan: bytes per session and lane; sessions per GPU from a profile"
    )
    plan.add_argument("files", nargs="*", metavar="FILE", help=files_help)
    plan.add_argument(
        "--profile", metavar="JSON", help="measured profile (bench/results/profile_*.json)"
    )
    plan.add_argument("--lanes", type=int, action="append", help="lane counts to predict (repeat)")
    plan.add_argument("--voices", type=int, default=1, help="distinct voices kept (turn starts)")
    plan.add_argument(
        "--values",
        type=int,
        default=1,
        help="distinct session-parameter values served (a prompt length per user)",
    )
    plan.add_argument(
        "--arrivals",
        type=float,
        metavar="SECONDS",
        help="the values' first sessions arrive over this many seconds (capture load)",
    )
    plan.add_argument("--format", choices=("text", "json"), default="text")
    plan.set_defaults(func=cmd_plan)

    from duplexcadence.compiler.cli_model import add_model_commands

    add_model_commands(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if MISSING_EXTRA is not None and args.command not in NEEDS_NO_COMPILER:
        print(
            f"clockc: the compiler needs {MISSING_EXTRA}, which is not installed: "
            "pip install 'duplexcadence[compile]'",
            file=sys.stderr,
        )
        return 2
    try:
        if args.explain is not None:
            return cmd_explain(args.explain)
        if args.command is None:
            parser.error(
                "a command is required (check, compile, plan, verify, draft or reproduce), "
                "or --explain"
            )
        return args.func(args)
    except UsageError as exc:
        print(f"clockc: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # the reader went away (`clockc check | head -1`): nothing left to say to it.
        # Point stdout at devnull so the interpreter's final flush does not fail too.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


if __name__ == "__main__":  # pragma: no cover
    # run the imported module, not this __main__ copy: cli_model imports its classes
    from duplexcadence.compiler import cli

    sys.exit(cli.main())
