"""runtime.serve — sessions spread over GPUs on Ray Serve (the optional ``[serve]`` extra).

Layers, one concept each; only ``app``, ``launch`` and ``client`` import ray, and only when asked
for (``import duplexcadence.runtime`` never imports this package):

  errors   Overloaded, SessionUnknown, SessionLost: what a client is told
  config   ServeConfig: contract, model, replicas, lanes, capacity per replica
  model    ServedModel: how a replica builds, binds and steps the user's model
  replica  ReplicaServer: one binding + SessionPool on one device (ray-free)
  router   SessionTable: session affinity and headroom (ray-free)
  app      the Ray Serve deployments: Replica per GPU, Ingress
  launch   build_app, app_builder (serve run / deploy), init_local, start
  journal  Journal: a session's calls, to rebuild it on another replica (ray-free)
  client   SessionClient: chunks straight to the session's replica (one hop)
  cli      ``duplexcadence-serve CONTRACT --model pkg.mod:fn``
"""

from __future__ import annotations

import importlib.util
from typing import Any

from .config import ServeConfig
from .errors import Overloaded, ServeError, SessionLost, SessionUnknown
from .model import ServedModel, ServedModelError, load_served_model

RAY_HINT = "Ray Serve is not installed: pip install 'duplexcadence[serve]'"


def ray_missing() -> str | None:
    """None if Ray is installed, else the install hint (looked up, not imported: an
    import of ray costs seconds)."""
    try:
        found = importlib.util.find_spec("ray") is not None
    except (ImportError, ValueError):  # ValueError: sys.modules["ray"] is None
        found = False
    return None if found else RAY_HINT


def build_app(config: ServeConfig) -> Any:
    from .launch import build_app as build

    return build(config)


def start(config: ServeConfig, **kwargs: Any) -> Any:
    from .launch import start as run

    return run(config, **kwargs)


def __getattr__(name: str) -> Any:
    if name == "SessionClient":  # imports ray: only when asked for
        from .client import SessionClient

        return SessionClient
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "Overloaded",
    "RAY_HINT",
    "ServeConfig",
    "ServeError",
    "ServedModel",
    "ServedModelError",
    "SessionClient",
    "SessionLost",
    "SessionUnknown",
    "build_app",
    "load_served_model",
    "ray_missing",
    "start",
]
