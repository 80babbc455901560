"""Helpers of the real-model tests (a helper module, not a test file).

``one_intra_op_thread``: an autouse fixture to import into a test module. On the shared
2-core machine OpenMP spin-waiting of two intra-op threads makes these models slower.

Observed call signatures vs the catalog a generated contract predicts: on CPU a bound adapter runs every call eagerly and never keys it, so the real-model
tests record what the stock loop passes to a declared callable with the runtime's own
``signature_of`` (shape, layout strides, dtype, device, requires_grad, 16-byte
alignment class: exactly what admission compares) and compare it with the signatures
of the catalog's materialised classes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from duplexcadence.runtime import materialize, signature_of
from duplexcadence.runtime.state.sites import get_at, set_at


@pytest.fixture(scope="module", autouse=True)
def one_intra_op_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def predicted_signatures(classes: list, device: Any = "cpu") -> dict[tuple, str]:
    """signature -> class name, for catalog classes that take no region views."""
    out = {}
    for cls in classes:
        args, kwargs, _aliased = materialize(cls, {}, torch.device(device), None)
        out[signature_of(args, kwargs)] = cls.name
    return out


def layout(x: Any) -> Any:
    """A readable record of one argument: (shape, stride, dtype, storage offset)."""
    if isinstance(x, torch.Tensor):
        return (tuple(x.shape), tuple(x.stride()), str(x.dtype), x.storage_offset())
    return repr(x)


@contextlib.contextmanager
def recording(obj: Any, steps: tuple) -> Iterator[list[tuple[tuple, tuple]]]:
    """Wrap the callable at ``steps`` on ``obj``; yields [(signature, layouts)] per call."""
    calls: list[tuple[tuple, tuple]] = []
    stock = get_at(obj, steps)
    parent, (kind, name) = get_at(obj, steps[:-1]), steps[-1]
    # a method wrapped on an instance: put the class's back by deleting the attribute
    own = kind != "attr" or name in vars(parent)

    def recorder(*args: Any, **kwargs: Any) -> Any:
        calls.append((signature_of(args, kwargs), tuple(layout(a) for a in args)))
        return stock(*args, **kwargs)

    set_at(obj, steps, recorder)
    try:
        yield calls
    finally:
        if own:
            set_at(obj, steps, stock)
        else:
            delattr(parent, name)


def contract_bytes_per_session(contract: str) -> int:
    """The bytes per session clockc plans for ``contracts/<contract>.clock``
    (compiler/plan.py: regions of lifetime turn or session)."""
    from pathlib import Path

    from duplexcadence.compiler.driver import read_and_compile
    from duplexcadence.compiler.plan import footprint

    path = Path(__file__).resolve().parents[1] / "contracts" / f"{contract}.clock"
    result = read_and_compile(path, emit=False)
    assert result.ok and result.checked is not None and result.analysis is not None
    return footprint(result.checked, result.analysis).per_session_bytes
