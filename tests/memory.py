"""Freed memory handed back to the system. glibc keeps freed heap pages (a real model's
GBs) in its arenas, and a thread allocating in another arena cannot reuse them (a lane's
worker thread does): ``release_freed_memory()`` collects garbage and trims, so a model
freed now does not stay in the process's peak beside the next one."""

import ctypes
import ctypes.util
import gc

_LIBC = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
_TRIM = getattr(_LIBC, "malloc_trim", None)


def release_freed_memory() -> None:
    gc.collect()
    if _TRIM is not None:
        _TRIM(0)
