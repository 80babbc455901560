"""Fresh worker processes, result files and the git facts of a document.

A driver runs every worker as ``python -m <module> --worker ...`` in a fresh process
from the repository root, echoes its stderr (unless quiet), keeps a tail of it for
failure records, and reads the result from the last JSON line the worker printed.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import shlex
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def json_default(o: Any) -> Any:
    if isinstance(o, (set, frozenset, tuple)):
        return list(o)
    try:
        return o.item()
    except Exception:  # noqa: BLE001 - not a numpy/torch scalar
        return str(o)


def write_json(path: Path, doc: dict) -> None:
    """Write atomically: a reader never sees half a document."""
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=1, default=json_default) + "\n")
    os.replace(tmp, path)


def git(*argv: str) -> str | None:
    try:
        p = subprocess.run(["git", *argv], cwd=REPO, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    return p.stdout.strip() if p.returncode == 0 else None


def git_info(override: str | None = None) -> dict:
    if override:
        return {"git_commit": override, "git_dirty": None, "git_commit_source": "--git-commit"}
    commit = git("rev-parse", "HEAD") or os.environ.get("DUPLEXCADENCE_GIT_COMMIT")
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"git_commit": commit, "git_dirty": None if status is None else bool(status)}


def _tee(stream: Any, keep: collections.deque, sink: Any = None, prefix: str = "") -> None:
    for line in iter(stream.readline, ""):
        keep.append(line)
        if sink is not None:
            sink.write(prefix + line)
            sink.flush()
    stream.close()


class WorkerProcess:
    """One worker started now (``cmd`` from the repository root, ``env``); ``result()``
    waits for it and returns its last JSON line, or a ``timeout`` / ``crash`` record, with
    ``returncode``, ``process_wall_s``, ``command`` and, unless ok, ``stderr_tail``.
    Several may run at once (the cadence harness starts one per session)."""

    def __init__(self, cmd: list[str], env: dict[str, str], *, label: str, quiet: bool) -> None:
        self.cmd, self.t0 = cmd, time.perf_counter()
        env = {"PYTHONUNBUFFERED": "1", **env}
        pipe = subprocess.PIPE
        self.proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=pipe, stderr=pipe, text=True)
        self.out: collections.deque = collections.deque(maxlen=100)
        self.err: collections.deque = collections.deque(maxlen=60)
        err = (self.proc.stderr, self.err, None if quiet else sys.stderr, f"[{label}] ")
        self.threads = [
            threading.Thread(target=_tee, args=a, daemon=True)
            for a in ((self.proc.stdout, self.out), err)
        ]
        for t in self.threads:
            t.start()

    def result(self, timeout: float, timeout_error: str) -> dict:
        timed_out = False
        try:
            self.proc.wait(timeout=max(0.0, timeout))
        except subprocess.TimeoutExpired:
            self.proc.kill()  # our own child, by its handle
            self.proc.wait()
            timed_out = True
        for t in self.threads:
            t.join(timeout=10)
        res = last_json_line(list(self.out))
        if timed_out:
            res = dict(res or {}, status="timeout", error=timeout_error)
        elif res is None:
            why = f"worker exited with code {self.proc.returncode} and printed no result"
            res = {"status": "crash", "error": why}
        if res.get("status") != "ok":
            res["stderr_tail"] = "".join(self.err)[-4000:]
        res["returncode"] = self.proc.returncode
        res["process_wall_s"] = time.perf_counter() - self.t0
        res["command"] = shlex.join(self.cmd[1:])
        return res


def last_json_line(lines: list[str]) -> dict | None:
    for line in reversed(lines):
        if line.strip().startswith("{"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                continue
    return None


def print_result_line(run: Any, result: dict, failure: Any = None) -> dict:
    """``run(result)`` with vendor prints sent to stderr; what it raises goes into
    ``result`` (``failure(e)``'s fields, else status "error" and the error) with its
    traceback; then ``result`` as one JSON line, the only line a worker prints on stdout."""
    real_stdout = sys.stdout
    with contextlib.redirect_stdout(sys.stderr):
        try:
            run(result)
        except BaseException as e:  # noqa: BLE001 - the driver records whatever happened
            fields = failure(e) if failure else {"error": f"{type(e).__name__}: {e}"}
            result.update(fields, traceback=traceback.format_exc())
            traceback.print_exc()
    real_stdout.write(json.dumps(result, default=json_default) + "\n")
    real_stdout.flush()
    return result
