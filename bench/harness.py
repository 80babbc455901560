"""What both benchmark drivers share: fresh worker processes, result files and the
replay record a worker writes from its Binding.

A driver runs every (block, cell) as ``python -m bench.<name> --worker ...`` in a
fresh process, echoes its stderr (unless quiet), keeps a tail of it for failure
records, and reads the worker's result from the last JSON line it printed.
``run_worker_process`` does that and turns a timeout or a crash into a record; the
caller adds what its benchmark needs (cell, block, seed, environment notes).
"""

from __future__ import annotations

import collections
import json
import os
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def json_default(o: Any) -> Any:
    if isinstance(o, (set, frozenset, tuple)):
        return list(o)
    if hasattr(o, "item"):
        try:
            return o.item()
        except Exception:  # noqa: BLE001
            pass
    return str(o)


def write_json(path: Path, doc: dict) -> None:
    """Write atomically: a reader never sees half a document."""
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=1, default=json_default) + "\n")
    os.replace(tmp, path)


def first_ok(blocks: list[dict], key: str) -> Any:
    """``key`` of the first worker result that ran ok and has it."""
    for b in blocks:
        for r in b["results"].values():
            if r.get("status") == "ok" and r.get(key) is not None:
                return r[key]
    return None


def git(*argv: str) -> str | None:
    try:
        p = subprocess.run(
            ["git", *argv], cwd=str(REPO), capture_output=True, text=True, timeout=20
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return p.stdout.strip() if p.returncode == 0 else None


def git_info(override: str | None = None) -> dict:
    if override:
        return {"git_commit": override, "git_dirty": None, "git_commit_source": "--git-commit"}
    commit = git("rev-parse", "HEAD") or os.environ.get("DUPLEXCADENCE_GIT_COMMIT")
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"git_commit": commit, "git_dirty": None if status is None else bool(status)}


def _tee(stream: Any, sink: Any, prefix: str, tail: collections.deque, keep: list | None) -> None:
    for line in iter(stream.readline, ""):
        tail.append(line)
        if keep is not None:
            keep.append(line)
        if sink is not None:
            sink.write(prefix + line)
            sink.flush()
    stream.close()


def run_worker_process(
    cmd: list[str],
    env: dict[str, str],
    *,
    label: str,
    timeout: float,
    quiet: bool,
    timeout_error: str,
) -> dict:
    """Run one worker (``cmd``, from the repository root, with ``env`` plus the repo on
    ``PYTHONPATH``); its last JSON line, or a ``timeout`` / ``crash`` record.

    Every record gets ``returncode``, ``process_wall_s`` and ``command``; one that is
    not ok also gets the worker's last stderr lines as ``stderr_tail``."""
    env = dict(env)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(REPO)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    )
    env.setdefault("PYTHONUNBUFFERED", "1")
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        cmd, cwd=str(REPO), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    out_lines: list[str] = []
    err_tail: collections.deque = collections.deque(maxlen=60)
    out_tail: collections.deque = collections.deque(maxlen=5)
    threads = [
        threading.Thread(
            target=_tee, args=(proc.stdout, None, "", out_tail, out_lines), daemon=True
        ),
        threading.Thread(
            target=_tee,
            args=(proc.stderr, None if quiet else sys.stderr, f"[{label}] ", err_tail, None),
            daemon=True,
        ),
    ]
    for t in threads:
        t.start()
    timed_out = False
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()  # our own child, by its handle
        proc.wait()
        timed_out = True
    for t in threads:
        t.join(timeout=10)
    wall = time.perf_counter() - t0
    res = None
    for line in reversed(out_lines):
        line = line.strip()
        if line.startswith("{"):
            try:
                res = json.loads(line)
                break
            except json.JSONDecodeError:
                continue
    if timed_out:
        res = dict(res or {}, status="timeout", error=timeout_error)
    elif res is None:
        res = {
            "status": "crash",
            "error": f"worker exited with code {proc.returncode} and printed no result",
        }
    if res.get("status") != "ok":
        res["stderr_tail"] = "".join(err_tail)[-4000:]
    res["returncode"] = proc.returncode
    res["process_wall_s"] = wall
    res["command"] = " ".join(shlex.quote(c) for c in cmd[1:])
    return res


# ---------------------------------------------------------------- replay telemetry
def replay_counters(binding: Any) -> dict:
    """{callable: {"hits": n, "misses": {reason: n}}} of a Binding (empty for none)."""
    if binding is None:
        return {}
    return {
        name: {"hits": int(r.hits), "misses": {k: int(v) for k, v in r.misses.items()}}
        for name, r in binding.replays.items()
    }


def counter_delta(after: dict, before: dict) -> dict:
    """What happened between two ``replay_counters`` readings (the measured window)."""
    out = {}
    for name, a in after.items():
        b = before.get(name, {"hits": 0, "misses": {}})
        misses = {k: v - b["misses"].get(k, 0) for k, v in a["misses"].items()}
        out[name] = {
            "hits": a["hits"] - b["hits"],
            "misses": {k: v for k, v in misses.items() if v},
        }
    return out


def replay_block(binding: Any, window: dict) -> dict | None:
    """A worker's replay record: the binding's per-callable stats plus the window's counters."""
    if binding is None:
        return None
    stats = binding.stats()
    callables = {}
    cap, warm = 0.0, 0.0
    for name, s in stats["callables"].items():
        cap += float(s.get("capture_s") or 0.0)
        warm += float(s.get("warmup_s") or 0.0)
        callables[name] = {
            "hits": s["hits"],
            "misses": s["misses"],
            "window_hits": window.get(name, {}).get("hits", 0),
            "window_misses": window.get(name, {}).get("misses", {}),
            "classes": len(s["classes"]),
            "captured_classes": sum(1 for c in s["classes"] if c["status"] == "captured"),
            "class_status": {c["name"]: c["status"] for c in s["classes"]},
            "rejected": s.get("rejected"),
            "effect": s.get("effect"),
            "invalidations": s.get("invalidations", 0),
            "capture_s": s.get("capture_s"),
            "warmup_s": s.get("warmup_s"),
            "capture_reserved_mib": (s.get("capture_reserved_bytes") or 0) / 2**20,
            "capture_allocated_mib": (s.get("capture_allocated_bytes") or 0) / 2**20,
        }
    return {"capture_s": cap, "warmup_s": warm, "callables": callables}
