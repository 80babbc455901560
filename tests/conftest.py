"""Tests marked ``@pytest.mark.cuda`` skip cleanly where CUDA is unavailable; freed
memory goes back to the system (the real-model tests free whole models)."""

import ctypes
import sys

import pytest
import torch

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter


def pytest_configure(config):
    """glibc raises its mmap threshold each time a large block is freed, so after the
    first freed model every tensor comes from the heap, which is never given back: the
    suite's RSS then grows by each real-model module's peak. A fixed threshold (64 KiB,
    what mmap serves) gives a freed tensor's pages back at once."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6").mallopt(M_MMAP_THRESHOLD, 64 * 1024)
        except (OSError, AttributeError):  # not glibc: nothing to tune
            pass


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)
