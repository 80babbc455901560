"""Object arguments (compiler/objects.py, runtime/serving/state_objects.py): a call
passed a vendor's cache object — which rebinds its tensors every call, keeps a host
offset and creates one member on its first call — is keyed by the object's member
regions and replays exactly, on the simulate backend that re-executes no Python."""

import importlib
from types import SimpleNamespace

import pytest
import torch

from duplexcadence.compiler.driver import compile_source
from fuzzing import import_package

CONTRACT = """
contract objects_demo
clock chunk = 1 per call
clock token = 2 per chunk
region kv {{
  dtype float32
  dims [1, token, 4]
  lifetime turn
  retention window(5 token)
  attended from 0 token by 2 token until 5 token
  site state.cache.layers[0].keys
}}
region pad {{
  dtype float32
  dims [1, 3]
  lifetime turn
  address pinned
  site state.cache.pad
}}
callable step {{
  site step
  per chunk
  arg x: float32 [1, 2, 4]
  kwarg {argument}: site {object_site}
  counter state.cache.pos advances 2 from 0 staged tracks kv
}}
"""


class Layer:
    def __init__(self) -> None:
        self.keys = torch.zeros(1, 0, 4)


class Cache:
    """Like transformers' caches: a list of layers whose keys the update rebinds to a
    trimmed ``torch.cat``, a host offset, and a left context that is None until the
    first call makes it (from that call's input, not zeros)."""

    def __init__(self) -> None:
        self.layers = [Layer()]
        self.pad: torch.Tensor | None = None
        self.pos = 0


class Model:
    def __init__(self) -> None:
        self.state = SimpleNamespace(cache=Cache())

    def step(self, x, cache):
        n = x.shape[1]
        positions = torch.arange(cache.pos, cache.pos + n, dtype=x.dtype)
        left = cache.pad if cache.pad is not None else x[:, 0, :3] * 3
        full = torch.cat([cache.layers[0].keys, x + positions[None, :, None]], dim=1)
        cache.layers[0].keys = full[:, -5:]
        cache.pad = x[:, -1, :3] + left
        cache.pos += n
        return (full * 2).sum(1) + left.sum()


def bound(argument: str = "cache", object_site: str = "state.cache"):
    source = CONTRACT.format(argument=argument, object_site=object_site)
    result = compile_source(source, "objects_demo.clock")
    assert result.ok, result.diagnostics
    name, _ = import_package(result.files)
    adapter = importlib.import_module(f"{name}.adapter")
    model = Model()
    binding = adapter.bind(model, device="cpu", backend="simulate", progress=False)
    return model, binding


def chunks(n: int):
    return [torch.randn(1, 2, 4, generator=torch.Generator().manual_seed(i)) for i in range(n)]


def test_a_cache_object_replays_exactly_after_its_first_call():
    model, binding = bound()
    ref = Model()
    for x in chunks(12):
        got = model.step(x, cache=model.state.cache)
        want = ref.step(x, cache=ref.state.cache)
        assert torch.equal(got, want)
    step = binding.stats()["callables"]["step"]
    # the first call meets `pad` None (the vendor makes it): eager; every other replays
    assert step["hits"] == 11 and step["misses"] == {"signature": 1}, step
    cache, stock = model.state.cache, ref.state.cache
    assert torch.equal(cache.layers[0].keys, stock.layers[0].keys)
    assert torch.equal(cache.pad, stock.pad) and cache.pos == stock.pos == 24
    # the object holds the regions' own storage: the carry's view and the pinned tensor
    assert cache.layers[0].keys.data_ptr() == binding.lanes[0].regions["kv"].data_ptr()
    assert cache.pad is binding.lanes[0].regions["pad"].tensor


def test_a_cache_the_caller_made_runs_eager_and_leaves_the_model_s_alone():
    model, binding = bound()
    own, ref = Cache(), Cache()
    stock = Model()
    for x in chunks(3):
        assert torch.equal(model.step(x, cache=own), stock.step(x, cache=ref))
    assert torch.equal(own.layers[0].keys, ref.layers[0].keys) and own.pos == ref.pos == 6
    step = binding.stats()["callables"]["step"]
    assert step["hits"] == 0 and sum(step["misses"].values()) == 3, step
    assert model.state.cache.pos == 0 and model.state.cache.pad is None


@pytest.mark.parametrize(
    "argument, object_site, message",
    [
        ('cache["c"]', "state.cache", "a whole keyword argument"),
        ("cache", "state.other", "no region has its site under 'state.other'"),
    ],
)
def test_a_bad_object_argument_is_clk058(argument, object_site, message):
    source = CONTRACT.format(argument=argument, object_site=object_site)
    result = compile_source(source, "objects_demo.clock")
    assert not result.ok
    found = [d for d in result.diagnostics if d.code == "CLK058"]
    assert found and message in found[0].message, result.diagnostics


def test_a_member_whose_clock_contradicts_its_stride_is_clk506():
    # the clock says 3 tokens a call, the member's extents grow by 2: the catalog would
    # hold extents the stream never reaches
    source = CONTRACT.format(argument="cache", object_site="state.cache").replace(
        "clock token = 2 per chunk", "clock token = 3 per chunk"
    )
    result = compile_source(source, "objects_demo.clock")
    found = [d for d in result.diagnostics if d.code == "CLK506"]
    assert found and "region 'kv'" in found[0].message and "3 token per chunk" in found[0].message
