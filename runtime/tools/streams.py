"""A user's stream: how to build an unmodified model and drive its streaming loop.

Contract of this layer: tools that must run a model beside its contract (`clockc verify`
compares a bound copy with a stock copy chunk by chunk; `clockc draft` traces a stock
copy to infer a contract) need the same two things from the user, and get them here in
one shape:

- `build()` returns a fresh stock model, deterministic (seeded weights), on the device
  the stream runs on. It is called once per copy, so two copies are bit-identical.
- `drive(model, chunks)` runs the model's own streaming loop for `chunks` chunks and
  yields one output per chunk (a tensor or a container of tensors). It must feed the
  same inputs every time it is called (seeded traffic), so two copies can be compared.

The user names a factory returning a `StreamSpec` as `package.module:function` (as
pytest and uvicorn name their targets). Loading it imports user code the user asked
for by name on the command line; contract text never names code.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch

__all__ = ["StreamSpec", "StreamSpecError", "load_stream_spec", "load_target"]


@dataclass(frozen=True)
class StreamSpec:
    """How to build a stock model and stream chunks through it (see module docstring)."""

    build: Callable[[], torch.nn.Module]
    drive: Callable[[torch.nn.Module, int], Iterator[Any]]
    # Where the model and its traffic live ("cpu" or "cuda"), for tools that report it.
    device: str = "cpu"


class StreamSpecError(ValueError):
    """A `module:function` target that does not name a StreamSpec factory."""


def load_target(target: str, expected: type, error: type[ValueError] = ValueError) -> Any:
    """Import `package.module:function`, call it, and check it returned an `expected`
    (the one convention by which tools name user code: streams here, served models in
    runtime/serve)."""
    module_name, sep, function_name = target.partition(":")
    if not sep or not module_name or not function_name:
        raise error(f"target {target!r}: expected 'package.module:function'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise error(f"target {target!r}: {e}") from None
    factory = getattr(module, function_name, None)
    if not callable(factory):
        raise error(f"target {target!r}: {module_name} has no callable {function_name!r}")
    made = factory()
    if not isinstance(made, expected):
        raise error(f"target {target!r} returned {type(made).__name__}, not a {expected.__name__}")
    return made


def load_stream_spec(target: str) -> StreamSpec:
    """Import `package.module:function` and call it; it must return a `StreamSpec`."""
    return load_target(target, StreamSpec, StreamSpecError)
