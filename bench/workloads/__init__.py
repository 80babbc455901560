"""Builders for the released third-party streaming models, seeded random weights.

Nothing here vendors third-party code: each module imports the installed package
and drives the vendor's own entry points.
"""

from __future__ import annotations


import importlib.metadata
import importlib.util


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
    """Why the released workload `dist==version` cannot run here (None when it can)."""
    if importlib.util.find_spec(module) is None:
        return f"{module} ({dist}=={version}) is not importable: pip install --no-deps -r {requirements}"
    installed = installed_version(dist)
    if installed != version:
        return f"{dist} {installed} is installed; the stock workload is {version}"
    for dep in deps:
        if importlib.util.find_spec(dep) is None:
            return f"{dep} is not installed ({requirements})"
    return None
