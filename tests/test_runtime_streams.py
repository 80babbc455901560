"""The stream-spec loader: a `module:function` target, or a clear error naming it."""

import sys
import types

import pytest
import torch

from duplexcadence.runtime.tools.streams import StreamSpec, StreamSpecError, load_stream_spec


def _spec() -> StreamSpec:
    def drive(model, chunks):
        for index in range(chunks):
            yield model(torch.full((2,), float(index)))

    return StreamSpec(build=lambda: torch.nn.Identity(), drive=drive)


@pytest.fixture
def user_module(monkeypatch):
    module = types.ModuleType("user_stream_module")
    module.make = _spec
    module.not_a_spec = lambda: 42
    module.constant = 3
    monkeypatch.setitem(sys.modules, "user_stream_module", module)
    return module


def test_loads_a_factory_and_drives_it(user_module):
    spec = load_stream_spec("user_stream_module:make")
    outputs = list(spec.drive(spec.build(), 3))
    assert [o.tolist() for o in outputs] == [[0.0, 0.0], [1.0, 1.0], [2.0, 2.0]]


@pytest.mark.parametrize(
    "target, message",
    [
        ("user_stream_module", "expected 'package.module:function'"),
        (":make", "expected 'package.module:function'"),
        ("no_such_module_xyz:make", "No module named"),
        ("user_stream_module:missing", "has no callable 'missing'"),
        ("user_stream_module:constant", "has no callable 'constant'"),
        ("user_stream_module:not_a_spec", "returned int, not a StreamSpec"),
    ],
)
def test_bad_targets_are_named(user_module, target, message):
    with pytest.raises(StreamSpecError, match=message) as error:
        load_stream_spec(target)
    assert target in str(error.value)
