"""Tests marked ``@pytest.mark.cuda`` skip cleanly where CUDA is unavailable; tests
marked ``known_gap`` (strict xfails that pin a known gap on a released model, minutes and
GBs each) run only with ``--known-gaps``; after every test module the memory its models
freed goes back to the system. A test marked ``@early(child)`` (``early_children.py``)
has its child process started right after collection."""

import pytest
import torch
from memory import release_freed_memory


@pytest.fixture(autouse=True, scope="module")
def _memory_back_after_each_module():
    yield
    release_freed_memory()  # one module's models do not raise the next module's peak


def pytest_addoption(parser):
    parser.addoption(
        "--known-gaps",
        action="store_true",
        help="also run the known_gap tests (strict xfails on released models; minutes, GBs)",
    )


def pytest_collection_modifyitems(config, items):
    # a known gap stays out of the default run: the draft of Token2Wav records 5 chunks
    # of 800 MB attention workspaces (74 s, 14 GiB peak on 2 cores, measured 2026-12-02),
    # which alone would double the suite's peak memory for a test that is expected to fail
    skip_gaps = not config.getoption("--known-gaps")
    gap = pytest.mark.skip(reason="known gap (strict xfail): run with --known-gaps")
    cuda = None if torch.cuda.is_available() else pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if skip_gaps and "known_gap" in item.keywords:
            item.add_marker(gap)
        if cuda is not None and "cuda" in item.keywords:
            item.add_marker(cuda)


_EARLY: list = []  # the children started after collection


def _skipped(item) -> bool:
    if next(item.iter_markers("skip"), None) is not None:
        return True
    return any(m.args and m.args[0] for m in item.iter_markers("skipif"))


def pytest_collection_finish(session):
    if session.config.option.collectonly:
        return
    for item in session.items:
        child = getattr(getattr(item, "function", None), "early_child", None)
        if child is not None and not _skipped(item):
            _EARLY.append(child)
            child.start()


def pytest_sessionfinish(session):
    for child in _EARLY:  # one the run never reached (-x, an interrupt): no cluster left
        child.stop()
