"""A pytest plugin for a child pytest run (``-p outcome_log``): the collected test ids,
then each test's outcome as soon as it is known, one JSON line each, flushed to the
file named by ``$OUTCOME_LOG``. The parent reads every result even when the child
process is ended abruptly after its last test (tests/test_serve.py says why)."""

from __future__ import annotations

import json
import os


def _write(record: dict) -> None:
    with open(os.environ["OUTCOME_LOG"], "a") as f:
        f.write(json.dumps(record) + "\n")


def pytest_collection_finish(session) -> None:
    _write({"collected": [item.nodeid for item in session.items]})


def pytest_runtest_logreport(report) -> None:
    # a passing test passes all three phases: its call is the one line; any phase that
    # does not pass (a fixture error, a failed teardown, a skip) is a line of its own
    if report.when == "call" or report.outcome != "passed":
        _write(
            {
                "test": report.nodeid,
                "when": report.when,
                "outcome": report.outcome,
                "report": None if report.passed else str(report.longrepr)[-4000:],
            }
        )
