"""Trusting a contract (issue 13, runtime side): verification against the model, replay
seen on a CPU (backend="simulate"), layout-preserving replay outputs, and arguments
matched by the callable's real signature. The model is tests/tiny_stream_model.py."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import pytest
import torch

import tiny_stream_model as tiny
from duplexcadence.compiler import cli, loader
from duplexcadence.runtime import ExactShapeReplay, FakeGraphBackend
from duplexcadence.runtime.engine.calls import CallConvention
from duplexcadence.runtime.engine.classes import CaptureClass, TensorSpec
from duplexcadence.runtime.tools.verify import verify_stream

WINDOW_12 = {"window(f_keep)": "window(12 frame)", "until f_keep": "until 12 frame"}


@pytest.fixture(scope="module")
def correct():
    return tiny.adapter()


def test_correct_contract_verifies_and_replays_every_chunk(correct):
    verdict = verify_stream(correct.bind, tiny.stream(), 20)
    assert verdict.ok and verdict.compared == 20 and verdict.regions == ["kv0", "kv1"]
    step = verdict.replay["step"]
    assert (step["calls"], step["hits"], step["misses"]) == (20, 20, {})
    assert "bit-identical" in verdict.describe() and not verdict.never_replayed


def test_a_callable_that_never_replays_fails_the_verdict_unless_eager_is_allowed(correct):
    """Exact is not enough: a contract under which its `replay` callable never replays
    (here every call refused) does not do what it says, and verify says which and why."""
    from duplexcadence.runtime.controls import replay_switch

    with replay_switch(False):
        verdict = verify_stream(correct.bind, tiny.stream(), 4)
        allowed = verify_stream(correct.bind, tiny.stream(), 4, allow_eager=True)
    assert verdict.divergence is None and verdict.compared == 4  # exact, still
    assert not verdict.ok and set(verdict.never_replayed) == {"step"}
    assert verdict.never_replayed["step"].startswith("disabled")
    text = verdict.describe()
    assert text.startswith("NOT verified") and "none of its calls replayed" in text
    assert allowed.ok and "accepted (--allow-eager)" in allowed.describe()
    assert verdict.to_json()["ok"] is False


def test_window_shorter_than_the_model_keeps_is_named_at_its_first_chunk():
    """Row 1: `window(12)` where the model keeps 16. bind(audit=True) checks the
    writeback against the contract's own policy and finds nothing; verify compares it
    with the stock copy's state at the same site and names region and chunk."""
    wrong = tiny.adapter(tiny.contract(**WINDOW_12))
    model = tiny.stream().build()
    binding = wrong.bind(model, audit=True, progress=False)
    list(tiny.stream().drive(model, 20))
    assert binding.regions["kv0"].audit_checks > 0
    assert binding.regions["kv0"].audit_divergences == 0  # the policy audit cannot see it

    verdict = verify_stream(wrong.bind, tiny.stream(), 20)
    d = verdict.divergence
    assert not verdict.ok and verdict.compared == 3
    assert (d.kind, d.name, d.site, d.chunk) == ("region", "kv0", 'cache["kv"]["l0"]', 3)
    assert (d.stock_shape, d.bound_shape) == ((1, 16, 64), (1, 12, 64))
    assert d.index == (0, 0, 0) and d.stock_value != d.bound_value
    assert d.box[1] == (0, 11)  # every kept frame differs: the window is 4 frames late
    text = verdict.describe()
    assert 'region kv0 (site cache["kv"]["l0"]) after chunk 3' in text
    assert "stock (1, 16, 64), bound (1, 12, 64)" in text


def test_arguments_passed_by_keyword_replay(correct):
    """Row 4: the caller passes the declared `arg`s as keywords."""
    verdict = verify_stream(correct.bind, tiny.keyword_stream(), 20)
    assert verdict.ok
    assert verdict.replay["step"]["hits"] == 20


def test_kwarg_declaration_replays_a_positional_caller():
    """The other way round: the contract says `kwarg`, the caller passes positions;
    the carries are still aliased (a hit needs them at the region's address)."""
    text = tiny.contract(
        **{
            "  arg x:": "  kwarg x:",
            "  arg conv_cache:": "  kwarg conv_cache:",
            '  arg kv["l0"]:': '  kwarg kv["l0"]:',
            '  arg kv["l1"]:': '  kwarg kv["l1"]:',
        }
    )
    verdict = verify_stream(tiny.adapter(text).bind, tiny.stream(), 20)
    assert verdict.ok and verdict.replay["step"]["hits"] == 20


def test_short_chunk_misses_once_and_replay_resumes(correct):
    """Row 5: one short chunk in the middle runs eager; its strided conv cache feeds the
    next call, and replay hands back outputs in the eager layout, so 19/20 replay."""
    verdict = verify_stream(correct.bind, tiny.short_chunk_stream(), 20)
    assert verdict.ok
    step = verdict.replay["step"]
    assert (step["calls"], step["hits"], step["misses"]) == (20, 19, {"signature": 1})
    assert "call 11 ran eager (signature): args[0]: shape captured (1, 32, 4), live (1, 32, 3)" in (
        verdict.report
    )


def test_fed_back_state_keeps_the_stock_layout_through_replay(correct):
    """Replay hands the conv cache back as the strided view eager code returns, so the
    bound copy's state has stock's layout after every chunk (a contiguous clone would
    differ from chunk 1 on, and downstream eager code would see another layout)."""
    spec = tiny.short_chunk_stream()
    stock, bound = spec.build(), spec.build()
    binding = correct.bind(bound, backend="simulate", progress=False)
    for chunk, (a, b) in enumerate(zip(spec.drive(stock, 20), spec.drive(bound, 20))):
        assert torch.equal(a, b)
        s, t = stock.cache["conv"], bound.cache["conv"]
        assert (t.stride(), t.storage_offset()) == (s.stride(), s.storage_offset()), chunk
    assert stock.cache["conv"].stride() == (192, 6, 1)
    assert binding.stats()["callables"]["step"]["hits"] == 19


def test_replayed_output_has_the_eager_layout():
    """A non-region output comes back with the eager output's shape, strides and
    storage offset (a plain clone would make the strided view contiguous)."""

    def fn(cache, x):
        xx = torch.cat([cache, x], dim=2)
        return xx[:, :, -2:], xx.transpose(1, 2)

    cls = CaptureClass(
        "c", (TensorSpec((1, 4, 2), torch.float32), TensorSpec((1, 4, 4), torch.float32))
    )
    engine = ExactShapeReplay(
        fn, name="f", classes=[cls], regions={}, device="cpu", backend=FakeGraphBackend()
    )
    engine.capture_all(progress=False)
    cache, x = torch.randn(1, 4, 2), torch.randn(1, 4, 4)
    eager = fn(cache, x)
    with torch.no_grad():
        replayed = engine(cache, x)
    assert engine.hits == 1
    for e, r in zip(eager, replayed):
        assert (r.shape, r.stride(), r.storage_offset()) == (
            e.shape,
            e.stride(),
            e.storage_offset(),
        )
        assert torch.equal(e, r)
    assert replayed[0].stride() == (24, 6, 1) and replayed[0].storage_offset() == 4


def test_cpu_binding_reports_eager_by_design(correct):
    model = tiny.stream().build()
    binding = correct.bind(model, progress=False)
    list(tiny.stream().drive(model, 3))
    report = binding.report()
    assert "no CUDA: eager by design" in report
    assert "callable step: 3 calls, eager" in report
    assert "0/15" not in report and "not_captured" not in report
    assert binding.stats()["callables"]["step"]["misses"] == {"no_cuda": 3}


def test_simulated_binding_reports_hit_rate_and_every_miss(correct):
    """Row 2 as the report shows it: a contract without `attended` would miss every
    call; here a stream of short chunks misses every call, each named with its leaf."""
    model = tiny.stream(short=True).build()
    binding = correct.bind(model, backend="simulate", progress=False)
    list(tiny.stream(short=True).drive(model, 12))
    report = binding.report()
    assert "callable step: 11/12 calls replayed (92%)" in report
    assert "call 11 ran eager (signature): args[0]: shape captured (1, 32, 4)" in report
    assert binding.stats()["callables"]["step"]["backend"] == "fake"


def test_capture_summary_is_one_line_on_stderr_unless_quiet(correct, capsys):
    correct.bind(tiny.stream().build(), backend="simulate", progress=False)
    assert capsys.readouterr().err == ""
    correct.bind(tiny.stream().build(), backend="simulate", progress=True)
    lines = [line for line in capsys.readouterr().err.splitlines() if "duplexcadence:" in line]
    assert len(lines) == 1
    assert "tiny_stream on cpu (fake): captured 15/15 classes of 1 callables" in lines[0]


def test_unknown_backend_is_refused_before_binding(correct):
    model = tiny.stream().build()
    with pytest.raises(ValueError, match="backend 'graphs'"):
        correct.bind(model, backend="graphs")
    assert "step" not in vars(model)  # nothing was installed


# ------------------------------------------------------------------ call forms
def test_call_convention_binds_by_the_real_signature():
    def f(a, b, c=3, *, d=4, **rest):
        return a, b, c, d, rest

    two = CallConvention(f, 2)
    assert two.normalise((1,), {"b": 2, "d": 5}) == ((1, 2), {"d": 5})
    assert two.normalise((1, 2, 9), {}) == ((1, 2), {"c": 9})
    assert two.normalise((), {"a": 1, "b": 2, "z": 0}) == ((1, 2), {"z": 0})
    assert two.normalise((1,), {}) == ((1,), {})  # does not bind: left for f to refuse
    assert CallConvention(f, 0).normalise((1, 2), {}) == ((), {"a": 1, "b": 2})

    def positional_only(a, b, /):
        return a, b

    assert CallConvention(positional_only, 1).normalise((1, 2), {}) == ((1, 2), {})

    def star(a, *more):
        return a, more

    assert CallConvention(star, 0).normalise((1, 2), {}) == ((1, 2), {})


# ------------------------------------------------------------------------ CLI
@pytest.fixture
def contract_file(tmp_path):
    def write(text: str):
        path = tmp_path / "tiny_stream.clock"
        path.write_text(text)
        return str(path)

    return write


def test_cli_verify_passes_a_correct_contract(contract_file, capsys):
    path = contract_file(tiny.CONTRACT)
    rc = cli.main(["verify", path, "--stream", "tiny_stream_model:short_chunk_stream"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "verified 20/20 chunks" in out and "19/20 calls replayed (simulate)" in out


def test_cli_verify_exits_1_when_nothing_replays_and_0_with_allow_eager(
    contract_file, capsys, monkeypatch
):
    path = contract_file(tiny.CONTRACT)
    monkeypatch.setenv("DUPLEXCADENCE_DISABLE_REPLAY", "1")
    argv = ["verify", path, "--stream", "tiny_stream_model:stream", "--chunks", "3"]
    assert cli.main(argv) == 1
    assert "callable step is declared `replay` but none" in capsys.readouterr().out
    assert cli.main([*argv, "--allow-eager"]) == 0


def test_cli_verify_shows_a_refused_binding_at_the_declaration(contract_file, capsys):
    """bind() refusing the model (a site it lacks) is a CLK090 diagnostic at the
    region's `site` line, not a traceback."""
    text = tiny.contract(**{'site cache["kv"]["l1"]': 'site cache["kv"]["l9"]'})
    line = text.splitlines().index('  site cache["kv"]["l9"]') + 1
    path = contract_file(text)
    assert cli.main(["verify", path, "--stream", "tiny_stream_model:stream"]) == 1
    err = capsys.readouterr().err
    assert f"{path}:{line}:3: error[CLK090]: bind() refused the model" in err
    assert "kv1" in err and "Traceback" not in err
    rc = cli.main(["verify", path, "--stream", "tiny_stream_model:stream", "--format", "json"])
    (entry,) = json.loads(capsys.readouterr().out)["contracts"]
    assert rc == 1 and not entry["ok"]
    assert [(d["code"], d["line"]) for d in entry["diagnostics"]] == [("CLK090", line)]


def test_cli_verify_names_the_divergence_in_json(contract_file, capsys):
    path = contract_file(tiny.contract(**WINDOW_12))
    rc = cli.main(["verify", path, "--stream", "tiny_stream_model:stream", "--format", "json"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 1
    assert doc["schema_version"] == cli.JSON_SCHEMA_VERSION and doc["command"] == "verify"
    (entry,) = doc["contracts"]
    d = entry["verify"]["divergence"]
    assert not entry["ok"] and (d["kind"], d["name"], d["chunk"]) == ("region", "kv0", 3)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--stream", "tiny_stream_model:nope"], "has no callable 'nope'"),
        (["--stream", "tiny_stream_model:stream", "--chunks", "0"], "--chunks must be"),
    ],
)
def test_cli_verify_usage_errors(contract_file, capsys, argv, message):
    rc = cli.main(["verify", contract_file(tiny.CONTRACT), *argv])
    assert rc == 2 and message in capsys.readouterr().err


def test_cli_verify_contract_errors_exit_1(contract_file, capsys):
    rc = cli.main(["verify", contract_file("contract x\nregion {"), "--stream", "a:b"])
    assert rc == 1 and "error[CLK" in capsys.readouterr().err


def test_cli_verify_refuses_a_target_that_is_no_adapter(capsys):
    rc = cli.main(["verify", "no_such_package_xyz", "--stream", "a:b"])
    assert rc == 2 and "not a .clock file" in capsys.readouterr().err


def test_cli_verify_leaves_no_temporary_package_behind(
    contract_file, capsys, monkeypatch, tmp_path
):
    # the compiled package is imported from a temporary folder: verify removes it
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    path = contract_file(tiny.CONTRACT)
    rc = cli.main(["verify", path, "--stream", "tiny_stream_model:short_chunk_stream"])
    assert rc == 0, capsys.readouterr().out
    assert list((tmp_path / "tmp").iterdir()) == []
    assert not [m for m in sys.modules if m.startswith("clockc_tiny_stream")]


def test_a_forgotten_generated_package_takes_its_folder_along():
    module = tiny.adapter()
    folder = Path(module.__file__).parent
    assert (folder / "__init__.py").is_file()
    loader.forget(module)
    assert not folder.parent.exists() and module.__name__ not in sys.modules


# ------------------------------------------------------------------------ GPU
@pytest.mark.cuda
def test_short_chunk_stream_on_cuda_graphs(correct):
    """The lead's GPU check: real graphs, layout-preserving outputs, bit-exact."""
    torch.backends.cudnn.deterministic = True
    verdict = verify_stream(correct.bind, tiny.stream(short=True, device="cuda"), 20)
    assert verdict.ok, verdict.describe()
    assert verdict.backend == "cuda"
    assert verdict.replay["step"]["hits"] == 19


@pytest.mark.cuda
def test_keyword_stream_on_cuda_graphs(correct):
    verdict = verify_stream(correct.bind, tiny.stream(keywords=True, device="cuda"), 20)
    assert verdict.ok, verdict.describe()
    assert verdict.replay["step"]["hits"] == 20
