"""bench/batch_rows.py without a GPU: the committed GPU results re-render to the
committed tables, and module paths fold into the components the table names."""

from pathlib import Path

from bench.batch_rows import component, render

RESULTS = Path(__file__).resolve().parents[1] / "bench" / "results"


def test_committed_results_rerender_to_the_committed_table():
    import json

    for name in ("batch_rows_moshi_h200", "batch_rows_token2wav_h100"):
        doc = json.loads((RESULTS / f"{name}.json").read_text())
        assert render(doc) == (RESULTS / f"{name}.md").read_text(), name


def test_module_paths_fold_into_components():
    assert component("lm_gen.lm_model.transformer.layers.31.self_attn") == (
        "lm_gen.lm_model.transformer"
    )
    assert component("mimi.decoder.model.3.block.1.conv.conv") == "mimi.decoder.model"
    assert component("") == "<top>"


def test_sessions_stack_session_major_on_each_inputs_batch_axis():
    import torch

    from bench.batch_rows import stacked

    def session(k):  # CFG's two rows per session: x (2, c, t), att_cache (depth, 2, ...)
        return {"x": torch.full((2, 3, 5), k), "att_cache": torch.full((4, 2, 8, 5, 6), k)}

    one = stacked([session(0), session(1), session(2)])
    assert one["x"].shape == (6, 3, 5) and one["att_cache"].shape == (4, 6, 8, 5, 6)
    assert one["x"][:, 0, 0].tolist() == [0, 0, 1, 1, 2, 2]
    assert one["att_cache"][0, :, 0, 0, 0].tolist() == [0, 0, 1, 1, 2, 2]


def test_estimator_scratch_is_fresh_per_width_and_restored():
    import torch

    from bench.batch_rows import estimator_scratch

    est = torch.nn.Module()
    est.register_buffer("cnn_cache_buffer", torch.ones(16, 2, 4, 2))
    est.register_buffer("att_cache_buffer", torch.ones(16, 2, 8, 10, 6))
    stock = est.att_cache_buffer
    with estimator_scratch(est, 3):
        assert est.cnn_cache_buffer.shape == (16, 6, 4, 2)
        assert est.att_cache_buffer.shape == (16, 6, 8, 10, 6)
        assert not est.att_cache_buffer.any()
        assert "att_cache_buffer" in dict(est.named_buffers())
    assert est.att_cache_buffer is stock


def test_bad_arguments_are_usage_errors_before_anything_is_built(monkeypatch, capsys):
    import pytest

    from bench import batch_rows

    def refuse(*_args):
        raise AssertionError("built a model for a bad command line")

    monkeypatch.setattr(batch_rows, "token2wav_probes", refuse)
    monkeypatch.setattr(batch_rows, "moshi_probes", refuse)
    for argv, said in [
        (["--model", "token2wav", "--probes", "lm"], "token2wav has estimator"),
        (["--widths", "1,2"], "at least 2"),
        (["--widths", "two"], "comma-separated integers"),
        (["--model", "token2wav", "--solo"], "Moshi's streams only"),
        (["--model", "token2wav", "--frames", "11"], "at most 10"),
        (["--frames", "0"], "at least 1"),
        (["--model", "token2wav", "--chunk", "-1"], "a chunk index"),
    ]:
        monkeypatch.setattr("sys.argv", ["batch_rows", "--tiny", *argv])
        with pytest.raises(SystemExit) as exit_:
            batch_rows.main()
        assert exit_.value.code == 2
        assert said in capsys.readouterr().err
