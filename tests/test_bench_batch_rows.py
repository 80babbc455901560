"""bench/batch_rows.py without a GPU: the committed H200 results re-render to the
committed table, and module paths fold into the components the table names."""

from pathlib import Path

from bench.batch_rows import component, render

RESULTS = Path(__file__).resolve().parents[1] / "bench" / "results"


def test_committed_results_rerender_to_the_committed_table():
    import json

    doc = json.loads((RESULTS / "batch_rows_moshi_h200.json").read_text())
    assert render(doc) == (RESULTS / "batch_rows_moshi_h200.md").read_text()


def test_module_paths_fold_into_components():
    assert component("lm_gen.lm_model.transformer.layers.31.self_attn") == (
        "lm_gen.lm_model.transformer"
    )
    assert component("mimi.decoder.model.3.block.1.conv.conv") == "mimi.decoder.model"
    assert component("") == "<top>"
