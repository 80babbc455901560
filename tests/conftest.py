"""Tests marked ``@pytest.mark.cuda`` skip cleanly where CUDA is unavailable; after
every test module the memory its models freed goes back to the system."""

import ctypes
import ctypes.util
import gc

import pytest
import torch

# glibc keeps freed heap pages (a real model's GBs) in its arenas; malloc_trim hands them
# back, so one module's models do not raise the next module's peak
_LIBC = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
_TRIM = getattr(_LIBC, "malloc_trim", None)


@pytest.fixture(autouse=True, scope="module")
def _memory_back_after_each_module():
    yield
    gc.collect()
    if _TRIM is not None:
        _TRIM(0)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)
