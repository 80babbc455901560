"""The served application's settings: one value, pickled to every replica.

``contract``: the generated adapter package (``duplexcadence.generated.<name>``: any
importable module with the generated ``bind(model, *, device, capture, progress)``);
``model``: the ``package.module:function`` of a ServedModel (model.py). One replica per
device: ``replicas`` of them, each given ``gpus_per_replica`` GPUs by Ray (0: the CPU)
and ``cpus_per_replica`` CPUs (Ray makes them its OMP/torch threads: 1 for 0), serving
at most ``max_sessions`` sessions on ``lanes`` replay lanes — take both from
the capacity plan (``clockc plan CONTRACT --profile PROFILE --lanes K``: its sessions
per GPU at the cadence). A replica whose heartbeat stream (one beat every
``heartbeat_s``) ends or stalls for ``stall_s`` is taken as dead: its sessions fail.
``transport``: how the ingress's calls reach a replica — ``"actor"`` (a Ray actor call,
Serve's default) or ``"grpc"`` (Serve's direct gRPC transport, which skips the object
store; ``bench.serve_hop`` times both). ``restore_calls``: a session opened through the
ingress whose replica dies is rebuilt on another replica by replaying its calls, while
it has made at most this many (journal.py); 0 (the default): it is lost.
``idle_timeout_s``: a session with no call for this long is closed by its replica and
its place freed (a client that vanished without closing would hold it for good); None
(the default): sessions live until closed.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Mapping

TRANSPORTS = ("actor", "grpc")  # how a call reaches a replica (the ingress's, a client's)


@dataclass(frozen=True)
class ServeConfig:
    contract: str
    model: str
    replicas: int = 1
    gpus_per_replica: float = 0.0
    cpus_per_replica: float = 0.0
    lanes: int = 1
    max_sessions: int = 4
    heartbeat_s: float = 0.2
    stall_s: float = 10.0
    name: str = "duplexcadence"
    transport: str = "actor"
    restore_calls: int = 0
    idle_timeout_s: float | None = None

    def __post_init__(self) -> None:
        for field in ("replicas", "lanes", "max_sessions"):
            v = getattr(self, field)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{field} must be a positive int, got {v!r}")
        v = self.restore_calls
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise ValueError(f"restore_calls must be 0 (off) or a positive int, got {v!r}")
        for field in ("gpus_per_replica", "cpus_per_replica"):
            if getattr(self, field) < 0:
                raise ValueError(f"{field} must not be negative")
        if not 0 < self.heartbeat_s < self.stall_s:
            raise ValueError("need 0 < heartbeat_s < stall_s")
        t = self.idle_timeout_s
        if t is not None and (isinstance(t, bool) or not isinstance(t, (int, float)) or t <= 0):
            raise ValueError(f"idle_timeout_s must be None (never) or seconds > 0, got {t!r}")
        if self.transport not in TRANSPORTS:
            raise ValueError(f"transport must be one of {TRANSPORTS}, got {self.transport!r}")

    @classmethod
    def from_args(cls, args: Mapping[str, Any]) -> "ServeConfig":
        """The config of a ``serve run`` / ``serve deploy`` application's ``args`` (launch.py,
        ``app_builder``): a YAML file's typed values, or ``key=value`` strings from the
        command line, coerced to each setting's type; an unknown key or a bad value is a
        ``ValueError`` that names it."""
        from pydantic import TypeAdapter, ValidationError  # a core dependency

        if not isinstance(args, Mapping):
            raise ValueError(f"args must be a mapping of setting to value, got {type(args).__name__}")  # fmt: skip
        known = [f.name for f in fields(cls)]
        unknown = sorted(set(args) - set(known))
        if unknown:
            raise ValueError(f"unknown setting(s) {unknown}; the settings are {known}")
        try:
            return TypeAdapter(cls).validate_python(dict(args))
        except ValidationError as e:
            problems = [
                f"{'.'.join(map(str, err['loc'])) or 'config'}: {err['msg']}" for err in e.errors()
            ]
            raise ValueError("; ".join(problems)) from None

    @property
    def device(self) -> str:
        """What a replica serves on: its GPU (Ray sets CUDA_VISIBLE_DEVICES) or the CPU."""
        return "cuda" if self.gpus_per_replica > 0 else "cpu"
