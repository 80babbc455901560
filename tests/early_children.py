"""Child processes that a test reads the outcome of, started as soon as the session has
collected its tests instead of when the test is reached. The Ray cluster cases
(``serve_cluster_cases.py``) spend most of their ~140 s waiting (a cluster starting,
deployments, replicas replaced after a kill); started early they wait while the
in-process tests run, instead of after them.

A test marks itself ``@early(child)``; ``tests/conftest.py`` starts every marked test's
child after collection when the test is selected and not skipped, and stops any child
still running when the session ends (an aborted run leaves no cluster behind). The test
calls ``child.result()``, which starts the child if nobody did and waits for it."""

from __future__ import annotations

import os
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Finished:
    returncode: int
    stdout: str
    stderr: str


class EarlyChild:
    def __init__(self, argv: list[str], env: dict[str, str], cwd: Path, timeout_s: float):
        self.argv, self.env, self.cwd, self.timeout_s = argv, env, cwd, timeout_s
        # the child's files: its output (a file, not a pipe nobody reads while it runs)
        # and whatever it writes to ``self.dir`` (the test tells it where through env)
        self._dir = tempfile.TemporaryDirectory(prefix="early_child_")
        self.dir = Path(self._dir.name)
        self._proc: subprocess.Popen | None = None

    def start(self) -> None:
        if self._proc is not None:
            return
        with open(self.dir / "stdout", "w") as out, open(self.dir / "stderr", "w") as err:
            self._proc = subprocess.Popen(
                self.argv,
                cwd=self.cwd,
                env={**os.environ, **self.env},
                stdout=out,
                stderr=err,
                text=True,
            )

    def result(self) -> Finished:
        self.start()
        try:
            code = self._proc.wait(timeout=self.timeout_s)
        except subprocess.TimeoutExpired:
            self.stop()
            raise
        return Finished(code, (self.dir / "stdout").read_text(), (self.dir / "stderr").read_text())

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()


def early(child: EarlyChild):
    """Mark a test whose child ``tests/conftest.py`` starts right after collection."""

    def mark(test):
        test.early_child = child
        return test

    return mark
