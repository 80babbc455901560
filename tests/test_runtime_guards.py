"""Host guards (`guard PATH == VALUE`, runtime/state/guards.py): a stock body that
branches on a host flag no argument shows — transformers' EncoderDecoderCache computes
a request's cross-attention keys on its first decoder call and sets `is_updated` —
runs that call eager and replays the rest, exactly, on the simulate backend."""

from types import SimpleNamespace

import pytest
import torch

from duplexcadence.compiler.driver import check_source
from fuzzing import compiled_adapter

CONTRACT = """
contract guard_demo
clock chunk = 1 per call
callable step {{
  site step
  per chunk
  arg x: float32 [1, 2, 4]
  arg enc: float32 [1, 3, 4]
{guard}}}
"""
GUARD = "  guard state.cache.is_updated[0] == true\n"


class CrossCache:
    """Like transformers' EncoderDecoderCache over static layers: keys at one address,
    filled in place by a request's first call, and a host flag per layer."""

    def __init__(self) -> None:
        self.is_updated: dict[int, bool] = {}
        self.keys = torch.zeros(1, 3, 4)


class Model:
    def __init__(self) -> None:
        self.w = torch.randn(4, 4, generator=torch.Generator().manual_seed(0))
        self.state = SimpleNamespace(cache=CrossCache())

    def step(self, x, enc):
        cache = self.state.cache
        if not cache.is_updated.get(0):
            cache.keys.copy_(enc @ self.w)  # the request's cross keys, from the encoder
            cache.is_updated[0] = True
        return x @ cache.keys.transpose(1, 2)


def bound(guard: str):
    adapter = compiled_adapter(CONTRACT.format(guard=guard), "guard_demo.clock")
    model = Model()
    binding = adapter.bind(model, device="cpu", backend="simulate", progress=False)
    return model, binding


def requests(n_requests: int, calls: int):
    g = torch.Generator().manual_seed(1)
    for _ in range(n_requests):
        enc = torch.randn(1, 3, 4, generator=g)
        yield enc, [torch.randn(1, 2, 4, generator=g) for _ in range(calls)]


def serve(model: Model, n_requests: int = 3, calls: int = 5) -> list[torch.Tensor]:
    out = []
    for enc, xs in requests(n_requests, calls):
        model.state.cache.is_updated.clear()  # a new request: the vendor's cache.reset()
        out += [model.step(x, enc) for x in xs]
    return out


def test_a_guarded_flag_runs_each_request_s_first_call_eager_and_replays_the_rest():
    model, binding = bound(GUARD)
    # capture ran with the flag set and left the model as it found it: no entry
    assert model.state.cache.is_updated == {}
    got, want = serve(model), serve(Model())
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    step = binding.stats()["callables"]["step"]
    assert step["hits"] == 12 and step["misses"] == {"host_guard": 3}, step
    details = [d for _, reason, d in binding.lanes[0].engines["step"].miss_log]
    assert "state.cache.is_updated[0] holds nothing; the graphs are for True" in details


def test_without_the_guard_the_flag_s_other_branch_is_what_a_graph_would_freeze():
    """The same model without the guard: the simulated replay of a request's first call
    takes the other branch than its capture, and the callable leaves replay (a real
    graph would replay the capture's branch: stale cross keys, no error)."""
    model, binding = bound("")
    got, want = serve(model), serve(Model())
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    step = binding.stats()["callables"]["step"]
    assert "stale_host_value" in step["misses"], step


def test_a_guard_must_be_a_model_value_compared_with_equality():
    for guard, code in [
        ("  guard result[0] == true\n", "CLK059"),
        ("  guard state.cache.is_updated[0] != false\n", "CLK059"),
        ("  guard state.__dict__ == true\n", "CLK050"),
    ]:
        result = check_source(CONTRACT.format(guard=guard), "guard_demo.clock")
        assert code in {d.code for d in result.diagnostics}, (guard, result.diagnostics)


@pytest.mark.cuda
def test_on_cuda_a_graph_replays_only_while_the_guard_holds():
    """Real graphs: without the guard nothing would notice the other branch; with it the
    first call of each request runs eager and every output equals the stock model's."""
    adapter = compiled_adapter(CONTRACT.format(guard=GUARD), "guard_demo.clock")
    model, stock = Model(), Model()
    for m in (model, stock):
        m.w = m.w.cuda()
        m.state.cache.keys = m.state.cache.keys.cuda()
    binding = adapter.bind(model, device="cuda", progress=False)
    assert model.state.cache.is_updated == {}

    def on_cuda(m):
        out = []
        for enc, xs in requests(3, 5):
            m.state.cache.is_updated.clear()
            out += [m.step(x.cuda(), enc.cuda()) for x in xs]
        return out

    got, want = on_cuda(model), on_cuda(stock)
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    step = binding.stats()["callables"]["step"]
    assert step["hits"] == 12 and step["misses"] == {"host_guard": 3}, step
