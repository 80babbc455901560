"""A served model: how a replica builds and binds the model, and runs one session.

Contract of this layer: the user names a factory returning a ``ServedModel`` as
``package.module:function`` (the convention of runtime/tools/streams.py, ``load_target``);
the replica (replica.py) calls it once per process. ``build(device, bind)`` returns the
stock model with seeded weights on ``device`` and calls ``bind(model)`` once — where
the contract's binding belongs (before a prompt is primed, say; if it never does, the
replica binds the returned model). ``open(model, pool, params)`` opens a session on the
replica's ``SessionPool`` for the client's ``params`` (a voice, a seed: whatever the
model's sessions are made of) and returns the pool's ``Session``; ``step(session,
payload)`` runs one chunk of it (``session.run(...)``) and returns its output on the
host (a float32 array of PCM, say; a tensor reaches a Ray client as its numpy array);
``reset(session)`` starts a new turn. Everything a client sends (params, payloads) and
gets back crosses processes, so it must pickle.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

from duplexcadence.runtime.tools.streams import load_target


def _reset(session: Any) -> None:
    session.reset()


@dataclass(frozen=True)
class ServedModel:
    build: Callable[[Any, Callable[[Any], Any]], Any]
    open: Callable[[Any, Any, Mapping[str, Any]], Any]
    step: Callable[[Any, Any], Any]
    reset: Callable[[Any], None] = _reset


class ServedModelError(ValueError):
    """A ``module:function`` target that does not name a ServedModel factory."""


def load_served_model(target: str) -> ServedModel:
    return load_target(target, ServedModel, ServedModelError)


__all__ = ["ServedModel", "ServedModelError", "load_served_model"]
