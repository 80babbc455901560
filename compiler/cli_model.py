"""`clockc` commands that run a user's model: verify, draft and reproduce.

Each imports torch and the runtime only when it runs (check, compile and plan work
without torch). The user names a ``StreamSpec`` factory as ``pkg.mod:fn``
(runtime/tools/streams.py); the model is theirs, the contract is data.

``reproduce`` asks whether the stock model is a function of its input at all: two
stock copies (in this process, or with ``--processes`` in two fresh ones) fed the
same traffic, every op traced (runtime/tools/reproduce.py). ``verify`` asks it first too
(``--reference``): a bound copy is only checkable against a reference that
reproduces itself.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from duplexcadence.compiler.cli import (
    UsageError,
    _diagnostics_json,
    _document,
    _print_diagnostics,
    _write,
)
from duplexcadence.dsl.diagnostics import error, render


def _load_user_stream(target: str):
    """The user's StreamSpec named `pkg.mod:fn` (verify, draft). Its module is the user's
    code in this folder, as pytest and uvicorn find theirs; a console script does not put
    the current folder on the path, so it is put there first."""
    from duplexcadence.runtime.tools.streams import StreamSpecError, load_stream_spec

    if "" not in sys.path and str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    try:
        return load_stream_spec(target)
    except StreamSpecError as exc:
        raise UsageError(str(exc)) from None


def cmd_verify(args) -> int:
    """Stream a model beside its bound copy and compare bit for bit (runtime/tools/verify.py).

    The runtime is imported here, not at module import: check, compile and plan work
    without torch, and the compiler depends on the runtime only for this command."""
    from duplexcadence.compiler.loader import LoadError, forget, load_adapter
    from duplexcadence.runtime.tools.verify import BindRefused, verify_stream

    if args.chunks < 1:
        raise UsageError(f"--chunks must be at least 1, got {args.chunks}")
    try:
        adapter, compiled = load_adapter(args.contract)
    except LoadError as exc:
        raise UsageError(str(exc)) from None
    entry: dict = {"path": args.contract, "stream": args.stream, "diagnostics": []}
    if compiled is not None:
        entry["diagnostics"] = _diagnostics_json(compiled)
        if args.format != "json":
            _print_diagnostics(compiled)
    if adapter is None:
        entry.update(ok=False, verify=None)
        if args.format == "json":
            print(_document("verify", [entry]))
        return 1
    try:
        spec = _load_user_stream(args.stream)
        verdict = verify_stream(
            adapter.bind,
            spec,
            args.chunks,
            device=args.device,
            backend=args.backend,
            reference_check=args.reference == "copies",
            allow_eager=args.allow_eager,
        )
    except BindRefused as exc:
        refused = bind_refused(str(exc), compiled)
        entry.update(ok=False, verify=None)
        entry["diagnostics"] = entry["diagnostics"] + [refused.to_json(args.contract)]
        if args.format == "json":
            print(_document("verify", [entry]))
        else:
            source = compiled.source if compiled is not None else ""
            print(render([refused], args.contract, source), file=sys.stderr)
        return 1
    finally:
        if compiled is not None:  # the package compiled here: its temporary folder goes
            forget(adapter)
    entry.update(ok=verdict.ok, verify=verdict.to_json())
    if args.format == "json":
        print(_document("verify", [entry]))
    else:
        print(verdict.describe())
        if args.report:
            print(verdict.report)
    return 0 if verdict.ok else 1


def bind_refused(message: str, compiled: Any) -> Any:
    """bind()'s refusal as a CLK090 diagnostic at the declaration it names: the region or
    callable named first in the message (its `site` line when the message is about a
    site); the file itself when it names none, or when the target was a package."""
    span = None
    contract = compiled.contract if compiled is not None else None
    if contract is not None:
        named = []
        for decl in (*contract.regions, *contract.callables):
            hit = re.search(rf"\b{re.escape(decl.name)}\b", message)
            if hit:
                named.append((hit.start(), decl))
        if named:
            decl = min(named, key=lambda pair: pair[0])[1]
            about_site = "site" in message and "site" in decl.prop_spans
            span = decl.prop_spans["site"] if about_site else decl.span
    return error("CLK090", f"bind() refused the model: {message}", span)


def cmd_draft(args) -> int:
    """Trace the model's streaming loop and write a `.clock` draft (compiler/draft.py).
    Runs the user's model, so torch and the runtime are imported here only."""
    if args.chunks < 2:
        raise UsageError("--chunks must be at least 2 (a carry shows across calls)")
    from duplexcadence.compiler.draft import render_draft
    from duplexcadence.compiler.driver import check_source
    from duplexcadence.runtime.tools.trace_draft import trace_stream

    spec = _load_user_stream(args.stream)
    text = render_draft(trace_stream(spec, args.chunks), args.name, source=args.stream)
    shown = args.output or "<draft>"
    result = check_source(text, shown)
    if args.output:
        _write(Path(args.output), text)
    else:
        sys.stdout.write(text)
    _print_diagnostics(result)
    state = "checks" if result.ok else "does not check (see above)"
    print(
        f"clockc draft: {shown} {state}; review its comments, then `clockc check`", file=sys.stderr
    )
    return 0 if result.ok else 1


def cmd_reproduce(args) -> int:
    """Two stock copies, the same traffic: does the model reproduce itself, and where
    do the copies first part (runtime/tools/reproduce.py)? Exit 0 reproducible, 1 not."""
    from duplexcadence.runtime.tools.reproduce import reproduce_stream
    from duplexcadence.runtime.tools.reproduce_records import record_trace

    if args.chunks < 1:
        raise UsageError(f"--chunks must be at least 1, got {args.chunks}")
    if not 0 <= args.trace_from < args.chunks:
        raise UsageError(f"--trace-from must be in 0..{args.chunks - 1}, got {args.trace_from}")
    if args.trace_from and (args.processes or args.no_trace):
        raise UsageError("--trace-from traces two copies in this process: not with "
                         "--processes or --no-trace")  # fmt: skip
    spec = _load_user_stream(args.stream)
    if args.record:  # one copy of --processes: a child writes its trace and stops
        record_trace(spec, args.chunks, args.record, trace=not args.no_trace)
        return 0
    if args.processes:
        result = _two_processes(args, spec.device)
    else:
        result = reproduce_stream(
            spec, args.chunks, trace=not args.no_trace, progress=True, trace_from=args.trace_from
        )
    if args.format == "json":
        print(_document("reproduce", [{"stream": args.stream, **result.to_json()}]))
    else:
        print(result.describe())
    return 0 if result.reproducible else 1


def _two_processes(args, device: str):
    """Run ``clockc reproduce --record`` in two fresh interpreters at once (they share the
    device, as two servers would; deterministic kernels do not care) and compare the
    two traces."""
    from duplexcadence.runtime.tools.reproduce_records import compare_records

    with tempfile.TemporaryDirectory(prefix="clockc-reproduce-") as tmp:
        paths = [Path(tmp) / f"copy{i}.jsonl" for i in (1, 2)]
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(Path.cwd()), env.get("PYTHONPATH", "")])
        children = []
        for path in paths:
            cmd = [
                sys.executable, "-m", "duplexcadence.compiler.cli", "reproduce",
                "--stream", args.stream, "--chunks", str(args.chunks), "--record", str(path),
            ]  # fmt: skip
            if args.no_trace:
                cmd.append("--no-trace")
            children.append(
                subprocess.Popen(
                    cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
                )
            )
        for child in children:
            out, err = child.communicate()
            if child.returncode != 0:
                tail = (err or out).strip().splitlines()[-1:] or ["no output"]
                raise UsageError(
                    f"the copy in a fresh process failed (exit {child.returncode}): {tail[0]}"
                )
        return compare_records(*paths, device=device)


def _stream_args(p) -> None:
    """``--stream`` and ``--chunks``, as the commands that compare copies take them."""
    p.add_argument(
        "--stream",
        required=True,
        metavar="MODULE:FUNCTION",
        help="a function returning a duplexcadence.runtime.tools.streams.StreamSpec",
    )
    p.add_argument("--chunks", type=int, default=20, help="chunks to compare (default 20)")


def add_model_commands(sub) -> None:
    """The subcommands that run a user's model (runtime/tools/streams.py names it)."""
    verify = sub.add_parser(
        "verify",
        help="stream a model and its bound copy side by side; report the first divergence",
    )
    verify.add_argument(
        "contract",
        metavar="CONTRACT_OR_PACKAGE",
        help="a .clock file, a generated package folder, or an importable package name",
    )
    _stream_args(verify)
    verify.add_argument(
        "--device", default=None, help="device to bind on (default: the StreamSpec's)"
    )
    verify.add_argument(
        "--backend",
        choices=("simulate", "cuda"),
        default=None,
        help="replay backend of the bound copy (default: cuda on a GPU, simulate elsewhere)",
    )
    verify.add_argument(
        "--report", action="store_true", help="print the bound copy's binding.report() too"
    )
    verify.add_argument(
        "--reference",
        choices=("copies", "skip"),
        default="copies",
        help="first check that two stock copies reproduce each other over the chunks "
        "(default copies; `clockc reproduce` finds where they part)",
    )
    verify.add_argument(
        "--allow-eager",
        action="store_true",
        help="accept a callable declared `replay` that never replayed (exact, but eager)",
    )
    verify.add_argument("--format", choices=("text", "json"), default="text")
    verify.set_defaults(func=cmd_verify)

    draft = sub.add_parser(
        "draft", help="trace a model's streaming loop and write a draft contract"
    )
    draft.add_argument(
        "--stream",
        required=True,
        metavar="PKG.MOD:FN",
        help="a function returning a StreamSpec (runtime/tools/streams.py), importable from here",
    )
    draft.add_argument("--chunks", type=int, default=6, help="chunks to trace (default 6)")
    draft.add_argument("--name", default=None, help="contract name (default: the model's class)")
    draft.add_argument(
        "-o", "--output", default=None, metavar="FILE", help="write here, not stdout"
    )
    draft.set_defaults(func=cmd_draft)

    repro = sub.add_parser(
        "reproduce",
        help="does the stock model reproduce itself? two copies, the same traffic, every op",
    )
    _stream_args(repro)
    repro.add_argument(
        "--processes",
        action="store_true",
        help="run the two copies in fresh processes (ops compared by fingerprint)",
    )
    repro.add_argument(
        "--no-trace", action="store_true", help="compare outputs only (fast): no op trace"
    )
    repro.add_argument(
        "--trace-from",
        type=int,
        default=0,
        metavar="K",
        help="trace ops from chunk K on (a trace costs seconds per chunk of a large model); "
        "earlier chunks compare outputs and streaming state only",
    )
    repro.add_argument("--record", metavar="FILE", help=argparse.SUPPRESS)
    repro.add_argument("--format", choices=("text", "json"), default="text")
    repro.set_defaults(func=cmd_reproduce)
