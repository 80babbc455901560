"""`clockc draft`: a contract traced from the tiny model of issue 13 replays it exactly.

The draft of `tiny_draft_model:stream` (a causal conv with kept left context, two
attention layers whose KV grows by torch.cat and is trimmed to 16 frames by the loop)
must check clean, find both KV carries with their window, clock and attended extents
and the conv context's two layouts, bind with the fake graph backend, and replay 20
chunks bit for bit with stock, every call a hit.
"""

import torch
from fuzzing import import_package
from tiny_draft_model import CONTRACT, DH, F, KEEP, LEFT, H, TinyStreamer, build, drive, stream

from duplexcadence.compiler.cli import main
from duplexcadence.compiler.draft import render_draft, reserved_words
from duplexcadence.compiler.driver import check_source, read_and_compile
from duplexcadence.dsl.parser import parse
from duplexcadence.runtime import FakeGraphBackend
from duplexcadence.runtime.tools.streams import StreamSpec
from duplexcadence.runtime.tools.trace_draft import trace_stream


def test_trace_finds_the_carries_and_the_hot_callable():
    trace = trace_stream(stream(), 6)
    assert [k.name for k in trace.callables] == ["step"]
    assert [(c.label, c.axis, c.stride, c.retention, c.order) for c in trace.carries] == [
        ("kv0", 3, 4, ("window", (16,)), "append"),
        ("kv1", 3, 4, ("window", (16,)), "append"),
    ]
    assert trace.carries[0].extents == [0, 4, 8, 12, 16, 16]
    assert trace.carries[0].site == (("attr", "state"), ("key", "kv0"))
    (step,) = trace.callables
    ctx = next(a for a in step.args if a.root == "ctx")
    assert {(l.stride, l.offset) for l in ctx.layouts} == {((16, 2, 1), 0), ((48, 6, 1), 4)}
    assert not trace.buffers and not trace.notes


def test_draft_declares_what_the_hand_written_contract_does():
    text = render_draft(trace_stream(stream(), 6), source="tiny_draft_model:stream")
    assert check_source(text, "draft.clock").diagnostics == []
    drafted, _ = parse(text)
    hand, _ = parse(CONTRACT)
    for mine, theirs in zip(drafted.regions, hand.regions):
        assert (mine.name, mine.site.dotted(), mine.lifetime) == (
            theirs.name,
            theirs.site.dotted(),
            theirs.lifetime,
        )
        assert mine.retention.kind == theirs.retention.kind == "window"
    (step,) = drafted.callables
    assert [(a.path.root, a.keyword) for a in step.args] == [
        ("x", False),
        ("ctx", False),
        ("kv0", False),
        ("kv1", False),
    ]
    assert step.aliased == ("kv0", "kv1") and [r.source.dotted() for r in step.retains] == [
        "result[2]",
        "result[3]",
    ]
    assert step.configs[0].values == ((16, 2, 0), (48, 6, 4))
    assert "# carried by step: grown by torch.cat along axis 3" in text


def test_cli_draft_binds_and_replays_exactly(tmp_path, capsys):
    out = tmp_path / "tiny.clock"
    assert (
        main(["draft", "--stream", "tiny_draft_model:stream", "--chunks", "6", "-o", str(out)]) == 0
    )
    assert "checks" in capsys.readouterr().err
    result = read_and_compile(out, emit=True, output=tmp_path / "gen")
    assert result.ok and not result.diagnostics
    _, adapter = import_package(result.files)
    expected = list(drive(build(), 20))
    model = build()
    binding = adapter.bind(model, device="cpu", backend=FakeGraphBackend(), progress=False)
    binding.capture(progress=False)
    got = list(drive(model, 20))
    assert len(got) == 20 and all(torch.equal(a, b) for a, b in zip(got, expected))
    assert binding.stats()["callables"]["step"]["hits"] == 20
    binding.unbind()


def test_cli_draft_refuses_a_bad_target(capsys):
    assert main(["draft", "--stream", "tiny_draft_model:missing"]) == 2
    assert "has no callable 'missing'" in capsys.readouterr().err


def test_reserved_words_are_read_from_the_grammar():
    words = reserved_words()
    assert {"region", "attended", "flush", "allocate", "arg", "kwarg", "until"} <= set(words)
    assert len(words) == len(set(words)) > 40


def test_the_language_reference_lists_every_reserved_word():
    from pathlib import Path

    text = Path(__file__).resolve().parents[1].joinpath("docs", "language.md").read_text()
    paragraph = text.split("**Reserved words.**", 1)[1].split("(`clockc draft`", 1)[0]
    listed = paragraph.split(":", 1)[1].replace("`", "").split()
    assert listed == list(reserved_words())


class _Box:
    """A state object of the vendor's own (transformers' ``DynamicCache`` is one)."""

    def __init__(self) -> None:
        self.t = torch.zeros(1, 4)


class _BoxModel(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.box = _Box()

    def step(self, x, box):
        box.t = box.t + self.lin(x)
        return box.t * 2


def _box_stream():
    from duplexcadence.runtime.tools.streams import StreamSpec

    def build():
        torch.manual_seed(0)
        return _BoxModel().eval()

    def drive(model, chunks):
        with torch.no_grad():
            for i in range(chunks):
                yield model.step(torch.full((1, 4), float(i)), model.box)

    return StreamSpec(build=build, drive=drive)


def test_a_call_it_cannot_key_is_drafted_eager_with_the_reason():
    text = render_draft(trace_stream(_box_stream(), 4), source="test:box")
    assert "  mode eager" in text
    assert "mode eager: replay keys every argument" in text and "is a _Box" in text
    # the box is the model's own object: the draft says how to declare it
    assert (
        "argument box is the object the model holds at box: declare it `kwarg box: site box`"
        in text
    )
    assert "box.t [1, 4] rebound every call: pinned" in text
    assert not [d for d in check_source(text, "draft.clock").diagnostics if d.severity == "error"]


class WorkspaceStreamer(TinyStreamer):
    """The tiny model as Token2Wav's flow writes its caches: each layer's new KV is
    copied into a workspace buffer of the model and returned as a view of it, so the
    next call rewrites in place what the last one returned."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("workspace", torch.zeros(2, 1, 2, H, KEEP + 2 * F, DH))

    def step(self, x, ctx, kv0, kv1):
        xc = torch.cat([ctx, x], dim=2)
        h = self.conv(xc).transpose(1, 2)
        views = []
        for i, (layer, kv) in enumerate(zip(self.layers, (kv0, kv1))):
            h, new = layer(h, kv)
            self.workspace[i, ..., : new.shape[3], :].copy_(new)
            views.append(self.workspace[i, ..., : new.shape[3], :])
        return h, xc[:, :, -LEFT:], views[0], views[1]


def _workspace_stream() -> StreamSpec:
    def build_workspace() -> WorkspaceStreamer:
        torch.manual_seed(0)
        return WorkspaceStreamer().eval()

    return StreamSpec(build=build_workspace, drive=drive)


def test_results_that_a_later_call_rewrites_in_place_are_recorded_as_returned():
    """Each result is a view of the workspace the next call overwrites: the trace must
    judge it by what the call returned (the carry grown by cat), not by what the buffer
    holds at the end of the run."""
    trace = trace_stream(_workspace_stream(), 6)
    assert [(c.label, c.axis, c.retention, c.order) for c in trace.carries] == [
        ("kv0", 3, ("window", (16,)), "append"),
        ("kv1", 3, ("window", (16,)), "append"),
    ]
    assert trace.carries[0].extents == [0, 4, 8, 12, 16, 16]


class CountingStreamer(TinyStreamer):
    """The tiny model with rotary-style positions from a host int it advances per call
    (a transformers cache's ``cumulative_length``), and a Python int it only reads."""

    def __init__(self) -> None:
        super().__init__()
        self.tokens = 0
        self.heads = H  # an int the call reads and never moves: not a counter

    def step(self, x, ctx, kv0, kv1):
        n = x.shape[2]
        x = x + torch.arange(self.tokens, self.tokens + n, dtype=x.dtype) / 1000
        self.tokens += n
        return super().step(x, ctx, kv0, kv1)


def _counting_stream() -> StreamSpec:
    def build_counting() -> CountingStreamer:
        torch.manual_seed(0)
        return CountingStreamer().eval()

    return StreamSpec(build=build_counting, drive=drive)


def test_a_host_int_every_call_advances_is_drafted_as_a_staged_counter():
    trace = trace_stream(_counting_stream(), 4)
    (step,) = trace.callables
    assert [(c.site, c.advances, c.start) for c in step.counters] == [((("attr", "tokens"),), F, 0)]
    text = render_draft(trace, source="test:counting")
    assert f"  counter tokens advances {F} from 0 staged\n" in text
    assert "a host int every call advanced by" in text
    assert check_source(text, "draft.clock").ok


def test_the_drafted_counter_binds_and_replays_the_positions_exactly(tmp_path):
    # draft -> compile -> bind: the positions follow the live counter on every replay
    spec = _counting_stream()
    out = tmp_path / "counting.clock"
    out.write_text(render_draft(trace_stream(spec, 6), source="test:counting"))
    result = read_and_compile(out, emit=True, output=tmp_path / "gen")
    assert result.ok, result.diagnostics
    _, adapter = import_package(result.files)
    expected = list(drive(spec.build(), 20))
    model = spec.build()
    binding = adapter.bind(model, device="cpu", backend=FakeGraphBackend(), progress=False)
    binding.capture(progress=False)
    got = list(drive(model, 20))
    assert all(torch.equal(a, b) for a, b in zip(got, expected))
    step = binding.stats()["callables"]["step"]
    assert step["hits"] == 20 and step["misses"] == {}, step
    assert model.tokens == 20 * F
    binding.unbind()


class ConstantStreamer(TinyStreamer):
    """The tiny model whose first output is zero on every call (as Mimi's codes are with
    random weights that leave its codebooks at zero)."""

    def step(self, x, ctx, kv0, kv1):
        h, ctx, kv0, kv1 = super().step(x, ctx, kv0, kv1)
        return h * 0, ctx, kv0, kv1


def test_a_result_that_never_changes_is_noted():
    def build_constant() -> ConstantStreamer:
        torch.manual_seed(0)
        return ConstantStreamer().eval()

    trace = trace_stream(StreamSpec(build=build_constant, drive=drive), 4)
    assert [n for n in trace.notes if "was the same on all" in n] == [
        "step: result[0] was the same on all 4 calls; a stream whose outputs never change "
        "proves nothing bit for bit (random weights can leave a codebook or a gate at zero: "
        "fill it with small random values)"
    ]
    assert not [n for n in trace_stream(stream(), 4).notes if "was the same" in n]
