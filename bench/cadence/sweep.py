"""The driver of a cadence sweep: which (arm, N) runs, in which order, within a budget.

Order (the most important points first, so a budget that runs out cuts the least):
the solo references of the ``--references`` sessions (a per-process reference arm's runs
are solo runs too and reference the sessions they served); every arm at N = 16 (the
headline p95); then, round-robin over the arms, the N above 16 in ascending order (the
search for the largest N with zero misses; an arm stops at its first N with a miss);
then the N below 16, descending. A run is launched only if its estimate (the arm's
slowest set-up seen, else ``--setup-estimate``, plus the run's duration and 20 s) fits
in what is left of ``--time-budget``; else it is recorded as skipped. ``--resume`` keeps
the runs already in the JSON at ``--out`` and launches only what is missing.

A run of the ``inproc`` shape is one worker process hosting N sessions (or P of them
each hosting every P-th session, for an arm of ``processes`` P); a ``procs`` run is N
worker processes, one session each; a run's workers are released together at one
wall-clock start time once all are built (``serve.barrier``). While a run streams, the GPU's utilisation
is sampled through NVML (``nvidia-ml-py``) when it imports (else ``gpu_busy_share`` is
null), and averaged over the run's window.
"""

from __future__ import annotations

import argparse
import json
import shlex
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.harness.document import artefact, cell_env
from bench.harness.process import WorkerProcess, git_info, write_json

from . import summary
from .cli import TRACE_FLAGS, trace_settings

GRACE_S = 20.0
MIN_RUN_S = 60.0  # a claim of N sessions at cadence needs a run this long without a miss


def run_seconds(window: list | None) -> float | None:
    """How long a run streamed: its workers' common window (first start, last end)."""
    return round(window[1] - window[0], 3) if window and window[1] else None


class GpuSampler:
    """NVML utilisation samples (epoch, percent of time a kernel ran) in a thread."""

    def __init__(self, index: int, every_s: float = 0.2) -> None:
        self.samples: list[tuple[float, int]] = []
        self.stop = threading.Event()
        try:
            import pynvml

            pynvml.nvmlInit()
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            name = pynvml.nvmlDeviceGetName(handle)
            self.name = name.decode() if isinstance(name, bytes) else name
            self.read = lambda: pynvml.nvmlDeviceGetUtilizationRates(handle).gpu
        except Exception:  # noqa: BLE001 - no NVML: busy share is null
            self.read, self.name = None, None
        self.thread = threading.Thread(target=self._run, args=(every_s,), daemon=True)
        self.thread.start()

    def _run(self, every_s: float) -> None:
        while self.read is not None and not self.stop.wait(every_s):
            self.samples.append((time.time(), int(self.read())))

    def share(self, window: list) -> float | None:
        vals = [u for t, u in self.samples if window[0] <= t <= window[1]]
        return round(sum(vals) / len(vals) / 100, 3) if vals else None


def worker_cmd(args: argparse.Namespace, arm: str, sessions: list[int], extra: list[str]) -> list:
    cmd = [sys.executable, "-m", "bench.cadence", "--worker", "--workload", args.workload]
    cmd += ["--arm", arm, "--sessions", ",".join(map(str, sessions)), "--device", args.device]
    for k in TRACE_FLAGS:
        v = getattr(args, k)
        cmd += [
            f"--{k.replace('_', '-')}",
            ",".join(map(str, v)) if isinstance(v, list) else str(v),
        ]
    return cmd + (["--threads", str(args.threads)] if args.threads else []) + extra


def launch(
    wl: Any,
    args: argparse.Namespace,
    arm: str,
    groups: list,
    unpaced: bool,
    limit_s: float | None = None,
) -> list:
    """Run one worker per group of sessions, all released together; their results.
    ``limit_s``: what is left of the sweep's time budget (a run that overruns it, say
    a pool whose backlog never drains, fails as late; the sweep writes what it has)."""
    timeout = args.setup_timeout + args.duration + GRACE_S
    if limit_s is not None:
        timeout = max(GRACE_S, min(timeout, limit_s))
    with tempfile.TemporaryDirectory() as tmp:
        go, procs = Path(tmp, "go"), []
        for g, sessions in enumerate(groups):
            extra = ["--unpaced"] if unpaced else ["--ready", f"{tmp}/ready.{g}", "--go", str(go)]
            extra += ["--barrier-timeout", str(args.setup_timeout)]
            cmd = worker_cmd(args, arm, sessions, extra)
            label = f"{arm} {','.join(map(str, sessions))[:20]}"
            procs.append(
                WorkerProcess(cmd, cell_env(wl, arm), label=label, quiet=args.quiet_workers)
            )
        deadline = time.time() + args.setup_timeout
        while not unpaced and time.time() < deadline:
            ready = sum(Path(tmp, f"ready.{g}").exists() for g in range(len(groups)))
            if ready == len(groups) or any(p.proc.poll() is not None for p in procs):
                break
            time.sleep(0.05)
        go.write_text(repr(time.time() + 0.5))
        return [p.result(timeout, f"run exceeded {timeout:.0f} s") for p in procs]


def order(lists: dict[str, list[int]]) -> list[tuple[str, int]]:
    """(arm, N) by importance: every arm at 16, then round-robin over the arms the N
    above 16 ascending, then the N below 16 descending (the module docstring)."""
    plan = [(a, 16) for a, ns in lists.items() if 16 in ns]
    above = {a: [n for n in ns if n > 16] for a, ns in lists.items()}
    below = {a: [n for n in reversed(ns) if n < 16] for a, ns in lists.items()}
    for side in (above, below):
        for rank in range(max(map(len, side.values()), default=0)):
            plan += [(a, ns[rank]) for a, ns in side.items() if rank < len(ns)]
    return plan


class Sweep:
    def __init__(self, wl: Any, args: argparse.Namespace, prior: dict | None, gpu: GpuSampler):
        self.wl, self.args, self.t0, self.gpu = wl, args, time.perf_counter(), gpu
        self.settings = trace_settings(args)
        prior = prior or {}
        self.runs: list[dict] = list(prior.get("runs") or [])
        self.prior_arms: dict[str, dict] = dict(prior.get("arms") or {})
        self.commands: list[str] = list(prior.get("commands") or [])
        self.commands.append("python -m bench.cadence " + shlex.join(args._argv))
        # {workload: {session index: hashes}}: several workloads may share one document
        self.all_refs: dict[str, dict] = dict(prior.get("references") or {})
        self.refs = self.all_refs.setdefault(wl.name, {})
        # {workload: {"settings", "reference_check"}}: each workload's trace and whether
        # its references reproduced, apart (a resumed document may hold another's runs)
        self.workloads: dict[str, dict] = prior_workloads(prior)
        own = self.workloads.get(wl.name, {}).get("reference_check") or {}
        # {session: {"status", "reproducible"}}: the second solo runs (references)
        self.reference_runs: dict[str, dict] = dict(own.get("sessions") or {})
        self.skipped: list[dict] = []

    def left(self) -> float:
        budget = self.args.time_budget or float("inf")
        return budget - (time.perf_counter() - self.t0)

    def fits(self, arm: str, n: int, unpaced: bool = False) -> str | None:
        setups = [r["setup_s"] for r in self.runs if r["arm"] == arm and r.get("setup_s")]
        est = max(setups, default=self.args.setup_estimate) + GRACE_S
        est += 0.0 if unpaced else self.args.duration
        why = f"{self.left():.0f} s left of --time-budget, estimate {est:.0f} s"
        return None if self.left() >= est else why

    def references(self) -> None:
        """Solo runs of the ``--references`` sessions, ``--reference-batch`` sessions one
        after another per process, and of the first ``--reference-repeats`` of them once
        more (where not checked yet), each in a fresh process of its own: all the
        processes at the same time (a session is only exact against a reference that
        reproduces itself)."""
        todo = [i for i in self.args.references if str(i) not in self.refs]
        batch = max(1, self.args.reference_batch)
        groups = [todo[k : k + batch] for k in range(0, len(todo), batch)]
        # not yet checked: a resumed document's references may never have been
        first = list(self.args.references)[: self.args.reference_repeats]
        again = [[i] for i in first if str(i) not in self.reference_runs]
        if not groups and not again:
            return
        why = self.fits(self.wl.reference, batch, unpaced=True)
        if why:
            self.skipped.append({"arm": "reference", "n": len(todo), "why": why})
            return
        arm, name = self.wl.reference, self.wl.name
        results = launch(self.wl, self.args, arm, groups + again, True)
        for g, res in zip(groups, results):
            self.adopt_references(res)
            self.runs.append({**res, "arm": arm, "n": len(g), "reference": True, "workload": name})
        keys = [st.key for st in self.wl.streams]
        for [i], res in zip(again, results[len(groups) :]):
            h = (res.get("hashes") or {}).get(str(i)) or (res.get("hashes") or {}).get(i)
            ref = self.refs.get(str(i))
            if res.get("status") != "ok" or h is None or ref is None:
                # a run that failed (out of memory beside the others) says nothing about
                # reproducibility: unchecked, so a resumed sweep runs it again
                self.skipped.append({"arm": "reference repeat", "n": i, "why": res.get("error")})
                continue
            same = all(h.get(k) == ref.get(k) for k in keys)
            self.reference_runs[str(i)] = {"status": res.get("status"), "reproducible": same}
        self.write(complete=False)  # the references survive a run that overruns

    def adopt_references(self, res: dict) -> None:
        """A session served alone in a fresh process on the reference arm — a reference
        run, or a run of a per-process reference arm, where each process serves one
        session — is that session's reference where it has none yet."""
        if res.get("status") == "ok":
            for i, h in (res.get("hashes") or {}).items():
                self.refs.setdefault(str(i), h)

    def done(self, arm: str, n: int) -> dict | None:
        """The ok run of (arm, N) already made (this sweep or a resumed one)."""
        ok = [r for r in self.runs if (r["arm"], r["n"], r.get("status")) == (arm, n, "ok")]
        return next((r for r in ok if not r.get("reference")), None)

    def run(self, arm: str, n: int) -> dict:
        groups = self.wl.arm(arm).groups(n)
        print(f"bench.cadence: {arm} N={n} ({self.left():.0f} s left)", file=sys.stderr)
        results = launch(self.wl, self.args, arm, groups, unpaced=False, limit_s=self.left())
        if arm == self.wl.reference and self.wl.arm(arm).shape == "procs":
            for r in results:
                self.adopt_references(r)
        for r in results:
            for i, h in (r.get("hashes") or {}).items():
                if str(i) not in self.refs:
                    # per-step hashes say where a stream parts from its reference: none
                    # here (32 sessions' lists were 3.3 MB a run, past what a device
                    # call brings back once a document held three runs)
                    for key in [k for k, v in h.items() if isinstance(v, list)]:
                        del h[key]
        windows = [r["window"] for r in results if r.get("window") and r["window"][1]]
        window = [min(w[0] for w in windows), max(w[1] for w in windows)] if windows else None
        bad = [r.get("error") or r.get("status") for r in results if r.get("status") != "ok"]
        keys = [s.key for s in self.wl.streams]
        point = {
            "arm": arm,
            "n": n,
            "run_s": run_seconds(window),
            "status": "ok" if not bad else "failed",
            "errors": bad[:5],
            **summary.run_metrics(
                results, self.args.deadline_ms, window and self.gpu.share(window)
            ),
            **summary.exactness(results, self.refs, keys),
            **summary.pool_counters(results),
            "setup_s": max((r.get("setup_s") or 0.0) for r in results),
            "workers": results,
        }
        self.runs.append(point)
        return point

    def sweep(self) -> None:
        self.references()
        plan = order({a: sorted(ns) for a, ns in self.args.arm_n.items()})
        missed: dict[str, int] = {}
        for arm, n in plan:
            point = None if self.args.rerun else self.done(arm, n)
            if point is None and self.args.stop_at_miss and n > missed.get(arm, n):
                self.skipped.append(
                    {"arm": arm, "n": n, "why": f"missed the deadline at N={missed[arm]}"}
                )
                continue
            why = None if point else self.fits(arm, n)
            if why:
                self.skipped.append({"arm": arm, "n": n, "why": why})
                continue
            point = point or self.run(arm, n)
            if point["status"] != "ok" or point["misses"]:
                missed[arm] = min(n, missed.get(arm, n))
            self.write(complete=False)

    def arms(self, points: dict[str, dict]) -> dict[str, dict]:
        """The per-arm summary of every arm with runs (this workload's or a resumed one's)."""
        out = {}
        for name, ps in points.items():
            meta = {k: self.prior_arms.get(name, {}).get(k) for k in ("workload", "shape", "what")}
            if name in {a.name for a in self.wl.arms}:
                arm = self.wl.arm(name)
                meta = {"workload": self.wl.name, "shape": arm.shape, "what": arm.what}
            pts = {int(n): p for n, p in ps.items()}
            out[name] = {**summary.arm_summary(pts, MIN_RUN_S), **meta}
        return out

    def document(self, complete: bool) -> dict:
        a = self.args
        points: dict[str, dict] = {arm: {} for arm in a.arm_n}
        for r in self.runs:
            if not r.get("reference"):
                point = {k: v for k, v in r.items() if k not in ("workers", "arm", "n")}
                points.setdefault(r["arm"], {})[str(r["n"])] = point
        first = next((w for r in self.runs for w in r.get("workers", [r])), {})
        checked = [r["reproducible"] for r in self.reference_runs.values()]
        settings = {**vars(self.settings), "deadline_ms": a.deadline_ms, "n": a.arm_n}
        refs = [a.references.start, a.references.stop]
        settings.update(references=refs, time_budget_s=a.time_budget, device=a.device)
        mine = self.workloads.get(self.wl.name, {})
        if a.rerender and mine.get("settings"):  # the settings the runs were made with
            settings = mine["settings"]
        check = {"reproducible": all(checked) if checked else None, "sessions": self.reference_runs}
        workloads = {
            **self.workloads,
            self.wl.name: {"settings": settings, "reference_check": check},
        }
        arms = self.arms(points)
        for arm in arms.values():
            own = (workloads.get(arm["workload"]) or {}).get("reference_check") or {}
            arm["reference_reproducible"] = own.get("reproducible")
            if own.get("reproducible") is False:  # nothing is exact against references that move
                arm["all_sessions_exact"] = None
                arm["exact_note"] = "no result: the solo references did not reproduce themselves"
        return {
            "benchmark": "sessions",
            "workload": " + ".join(sorted({v["workload"] for v in arms.values() if v["workload"]})),
            "command": self.commands[-1],
            "commands": self.commands,
            **git_info(a.git_commit),
            "torch": first.get("torch"),
            "gpu": self.gpu.name or first.get("device_name"),
            "host": socket.gethostname(),
            "reference_arm": self.wl.reference,
            # every arm's references reproduced (null: some workload's were not checked)
            "reference_reproducible": _all_known(
                a["reference_reproducible"] for a in arms.values()
            ),
            # the pooled arms' lane 0 catalog capture (seconds), and the longest lane wait
            # of the largest run (what tools read; per arm and N in per_n)
            "capture_s_at_bind": _first(
                p.get("capture_s_at_bind") for ps in points.values() for p in ps.values()
            ),
            "max_lane_wait_ms": _first(a.get("max_lane_wait_ms_at_max_n") for a in arms.values()),
            "settings": settings,  # this command's; every workload's in workloads
            "workloads": workloads,
            "arms": arms,
            "per_n": points,
            "references": self.all_refs,
            "skipped": self.skipped,
            "complete": complete,
            "wall_s": time.perf_counter() - self.t0,
            "runs": self.runs,
        }

    def write(self, complete: bool) -> dict:
        doc = self.document(complete)
        out = Path(self.args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        write_json(artefact(out, ".json"), doc)
        return doc


def prior_workloads(prior: dict) -> dict[str, dict]:
    """The per-workload settings and reference checks of a resumed document (one written
    before documents kept them per workload held one workload's, at the top level)."""
    if "workloads" in prior:
        return dict(prior["workloads"])
    name = prior.get("workload")
    if not name or " + " in name:
        return {}
    return {
        name: {"settings": prior.get("settings"), "reference_check": prior.get("reference_check")}
    }


def _all_known(values: Any) -> bool | None:
    """False if any is False, else None if any is unknown, else True (None if empty)."""
    values = list(values)
    if False in values:
        return False
    return None if not values or None in values else True


def _first(values: Any) -> Any:
    return next((v for v in values if v is not None), None)


def run(wl: Any, args: argparse.Namespace) -> int:
    """The sweep of ``args`` (``cli.parse_args``): JSON after every run, then .md and .png."""
    names = args.arms.split(",") if args.arms else [a.name for a in wl.arms]
    own = dict(x.split("=", 1) for x in args.arm_n)
    args.arm_n = {a: [int(n) for n in own.get(a, args.n).split(",")] for a in names}
    gpu = GpuSampler(args.gpu_index)
    host = (gpu.name or socket.gethostname()).split()[-1].lower()
    args.out = args.out or f"bench/results/sessions_{host}"
    out = Path(args.out)
    prior = None
    if (args.resume or args.rerender) and artefact(out, ".json").exists():
        prior = json.loads(artefact(out, ".json").read_text())
    if args.rerender and prior is None:
        print(
            f"bench.cadence: --rerender: no document at {artefact(out, '.json')}", file=sys.stderr
        )
        return 2
    sweep = Sweep(wl, args, prior, gpu)
    if args.rerender:  # re-summarise the runs of --out; runs nothing
        sweep.commands.pop()
        doc = sweep.write(complete=bool(prior and prior.get("complete")))
    else:
        sweep.sweep()
        doc = sweep.write(complete=True)
    artefact(out, ".md").write_text(summary.markdown(doc))
    summary.plot(doc, artefact(out, ".png"))
    print(summary.markdown(doc))
    return 0
