"""Builders for the released third-party streaming models, seeded random weights.

Nothing here vendors third-party code: each module imports the installed package
and drives the vendor's own entry points. ``unavailable_reason(name)`` says, with the
install command, why a workload cannot run here, without importing it (nor numpy), so
that tests and workers can skip or fail with the hint instead of an ImportError.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import sys
import types
from dataclasses import dataclass


@dataclass(frozen=True)
class Release:
    module: str  # the importable package
    dist: str  # its distribution on PyPI
    version: str  # the stock version the workload is written against
    requirements: str  # what installs it (with --no-deps)
    deps: tuple[str, ...]  # modules it imports besides torch


RELEASES = {
    "token2wav": Release(
        "stepaudio2",
        "minicpmo-utils",
        "1.0.6",
        "bench/requirements-token2wav.txt",
        ("einops", "scipy", "numpy"),
    ),
    # 1.0.7 installs beside 1.0.6 (same package name), into a folder that
    # bench.workloads.token2wav107 puts first on sys.path: see requirements-token2wav107.txt
    "token2wav107": Release(
        "stepaudio2",
        "minicpmo-utils",
        "1.0.7",
        "bench/requirements-token2wav107.txt --target .vendor/minicpmo-utils-1.0.7",
        ("einops", "scipy", "numpy"),
    ),
    "moshi": Release(
        "moshi",
        "moshi",
        "0.2.13",
        "bench/requirements-moshi.txt",
        ("numpy", "einops", "safetensors", "huggingface_hub", "sentencepiece"),
    ),
}


def subseed(seed: int, k: int) -> int:
    """Independent seeds for the parts of one workload (weights, prompt, inputs)."""
    return 16 * int(seed) + k


def installed_version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def release_missing(
    module: str, dist: str, version: str, requirements: str, deps: tuple[str, ...]
) -> str | None:
    """Why the released workload ``dist==version`` cannot run here, with the command that
    installs it (None when it can). Looks at import specs only: imports nothing."""
    hint = f"pip install --no-deps -r {requirements}"
    if importlib.util.find_spec(module) is None:
        return f"{module} ({dist}=={version}) is not importable: {hint}"
    installed = installed_version(dist)
    if installed != version:
        return f"{dist} {installed} is installed; the stock workload is {version}: {hint}"
    for dep in deps:
        if importlib.util.find_spec(dep) is None:
            return f"{dep} is not installed: {hint}"
    return None


def unavailable_reason(name: str) -> str | None:
    """``release_missing`` of a workload in ``RELEASES``, by its name."""
    r = RELEASES[name]
    return release_missing(r.module, r.dist, r.version, r.requirements, r.deps)


def register_bare_parent(package: str) -> types.ModuleType:
    """Register ``package`` as a bare parent with the installed package's real ``__path__``,
    so its submodules import without running its ``__init__.py`` (which imports a
    vendor's whole stack). Idempotent: an already imported package is returned as is."""
    if package in sys.modules:
        return sys.modules[package]
    spec = importlib.util.find_spec(package)
    assert spec is not None and spec.submodule_search_locations is not None
    parent = types.ModuleType(package, "parent package registered by bench.workloads")
    parent.__path__ = list(spec.submodule_search_locations)
    parent.__spec__ = spec
    parent.__package__ = package
    parent.__file__ = spec.origin
    parent.__duplexcadence_bare_parent__ = True
    sys.modules[package] = parent
    return parent
