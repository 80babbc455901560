"""Lockstep (`batch` on a callable, `slot` on a region) through every layer of clockc:
grammar and printer, the graph count against the budget, the report, the generated code
(and what the runtime's `ContractDecl.at_width` makes of it). The diagnostics each have
an error golden (tests/errors/batch_*.clock, slot_*.clock)."""

import importlib
import json
from pathlib import Path

import pytest

from duplexcadence.compiler.cli import main
from duplexcadence.compiler.driver import check_source, compile_source
from duplexcadence.compiler.plan import footprint, footprint_json, plan_text
from duplexcadence.compiler.report import analysis_json, analysis_tables, catalog_and_session
from duplexcadence.dsl.parser import parse
from duplexcadence.dsl.printer import print_contract
from fuzzing import import_package

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "tests" / "golden" / "batched" / "contract.clock"
ERRORS = ROOT / "tests" / "errors"

SMALL = """
contract small_lockstep
catalog budget {budget}
clock frame = 1 per call
region kv {{
  dtype float32
  dims [2, 1, frame, 4]
  retention ring(8 frame)
  site model.kv
  slot 1
}}
callable step {{
  site model.step
  per frame
  arg x: float32 [1, n]
  config n in {{4, 8}}
  writes kv
  batch widths {{{widths}}} axis 0 rows {{aten.mean.dim, aten.mm.default}}
}}
"""


def small(budget=64, widths="8, 16"):
    return SMALL.format(budget=budget, widths=widths)


# ---------------------------------------------------------------- grammar and printer
def test_parse_batch_and_slot():
    contract, diags = parse(small())
    assert not diags
    [k] = contract.callables
    assert k.batch.widths == (8, 16)
    assert k.batch.axis == 0
    assert k.batch.rows == ("aten.mean.dim", "aten.mm.default")
    assert contract.regions[0].slot == 1
    # axis and rows are optional; op names may contain keywords (`default`, `max`)
    text = small().replace(" axis 0 rows {aten.mean.dim, aten.mm.default}", "")
    contract, diags = parse(text)
    assert not diags and contract.callables[0].batch.axis == 0
    assert contract.callables[0].batch.rows == ()
    contract, diags = parse(small().replace("aten.mm.default", "aten.max.dim"))
    assert not diags and contract.callables[0].batch.rows[1] == "aten.max.dim"


def test_a_row_op_may_run_on_blocks_of_sessions():
    # `by 8`: the op runs on blocks of 8 sessions (invariant up to 8), printed back as
    # written, shown in the report, and generated as one block count per op
    text = small().replace("aten.mm.default}", "aten.mm.default by 8}")
    contract, diags = parse(text)
    assert not diags
    batch = contract.callables[0].batch
    assert batch.rows == ("aten.mean.dim", "aten.mm.default") and batch.blocks == (1, 8)
    assert "rows {aten.mean.dim, aten.mm.default by 8}" in print_contract(contract)
    assert parse(print_contract(contract))[0].model_dump() == contract.model_dump()
    result = check_source(text, "small.clock")
    assert "per row: aten.mean.dim, aten.mm.default by 8" in catalog_and_session(result.analysis, 0)
    result = compile_source(text, "small.clock")
    assert 'rows=("aten.mean.dim", "aten.mm.default"), blocks=(1, 8)' in result.files["contract.py"]
    name, _ = import_package(result.files)
    [step] = importlib.import_module(f"{name}.contract").DECLARED.callables
    assert step.batch.row_ops() == {"aten.mean.dim": 1, "aten.mm.default": 8}
    assert step.batch.rows_shown() == ["aten.mean.dim", "aten.mm.default by 8"]


def test_a_row_op_may_be_scoped_to_a_module():
    # `aten.mm.default in transformer.layers.*.gating by 8`: the scope is part of the
    # row's name through every layer (parse, print, report, generated declaration)
    scoped = "aten.mm.default in transformer.layers.*.gating"
    text = small().replace("aten.mm.default}", f"{scoped} by 8, aten.mm.default}}")
    contract, diags = parse(text)
    assert not diags, diags
    batch = contract.callables[0].batch
    assert batch.rows == ("aten.mean.dim", scoped, "aten.mm.default")
    assert batch.blocks == (1, 8, 1)
    assert f"rows {{aten.mean.dim, {scoped} by 8, aten.mm.default}}" in print_contract(contract)
    assert parse(print_contract(contract))[0].model_dump() == contract.model_dump()
    result = compile_source(text, "small.clock")
    assert result.ok, result.diagnostics
    name, _ = import_package(result.files)
    [step] = importlib.import_module(f"{name}.contract").DECLARED.callables
    assert step.batch.row_ops() == {"aten.mean.dim": 1, scoped: 8, "aten.mm.default": 1}
    # without `by` nothing is recorded: every op one session at a time
    assert parse(small())[0].callables[0].batch.blocks == ()


def test_print_parse_round_trip():
    for text in (small(), GOLDEN.read_text()):
        contract, diags = parse(text)
        assert not diags
        printed = print_contract(contract)
        assert "batch widths {" in printed and "slot " in printed
        again, diags = parse(printed)
        assert not diags
        assert again.model_dump() == contract.model_dump()


def test_batch_twice_is_a_duplicate_property():
    text = small().replace("  writes kv\n", "  writes kv\n  batch widths {2}\n")
    _, diags = parse(text)
    assert [d.code for d in diags] == ["CLK026"]


def test_the_new_words_are_keywords():
    for word in ("batch", "widths", "axis", "rows", "slot"):
        _, diags = parse(f"contract c\nconst {word} = 1\n")
        assert [d.code for d in diags] == ["CLK001"], word


def test_a_misspelt_batch_gets_a_suggestion():
    _, diags = parse("contract c\ncallable k {\n  bach widths {8}\n}\n")
    assert "did you mean 'batch'?" in diags[0].message


# ---------------------------------------------------------------- graphs against the budget
def test_graphs_are_classes_times_widths():
    result = check_source(small(), "small.clock")
    assert result.ok, result.diagnostics
    [k] = result.analysis.callables
    assert k.width == 2 and k.batch_widths == (8, 16) and k.graphs == 4
    assert result.analysis.batch_widths == (8, 16)


def test_the_budget_counts_graphs_not_classes():
    # 2 classes fit a budget of 3; 2 classes x 2 widths = 4 graphs do not
    result = check_source(small(budget=3), "small.clock")
    [d] = [d for d in result.diagnostics if d.code == "CLK030"]
    assert "catalog width 2 x 2 batch widths = 4 graphs exceeds budget 3" in d.message
    assert check_source(small(budget=4), "small.clock").ok
    assert check_source(small(budget=3, widths="8"), "small.clock").ok


def test_widths_are_one_lockstep_whatever_their_order():
    text = small().replace(
        "callable step {",
        "callable other {\n  site model.other\n  per frame\n"
        "  batch widths {16, 8}\n}\ncallable step {",
    )
    result = check_source(text, "small.clock")
    assert result.ok, result.diagnostics


# ---------------------------------------------------------------- the report
def test_report_shows_lockstep_only_for_a_batched_contract():
    result = check_source(small(), "small.clock")
    a = result.analysis
    tables = analysis_tables(a)
    assert "small_lockstep: lockstep (batched callables)" in tables
    assert "2 x 2 = 4" in tables and "aten.mean.dim, aten.mm.default" in tables
    assert "small_lockstep: slotted regions" in tables and "at width 16 MiB" in tables
    fp = footprint(result.checked, a)
    text = catalog_and_session(a, fp.per_session_bytes)
    assert "batched at widths 8, 16 on axis 0: 4 graphs; per row: aten.mean.dim" in text
    per_session = 2 * 1 * 8 * 4 * 4
    assert f"{per_session:,} bytes per session" in text
    assert f"{16 * per_session:,} bytes of slotted regions at batch width 16" in text
    doc = analysis_json(a)
    assert doc["batch_widths"] == [8, 16]
    assert doc["callables"][0]["graphs"] == 4 and doc["callables"][0]["batch_axis"] == 0
    assert doc["callables"][0]["batch_rows"] == ["aten.mean.dim", "aten.mm.default"]
    kv = doc["regions"][0]
    assert (kv["slot"], kv["slot_bytes"], kv["batch_bytes"]) == (1, per_session, 16 * per_session)
    plan = plan_text(fp, [])
    assert "at batch width 16" in plan and footprint_json(fp)["regions"][0]["slot"] == 1

    plain = check_source(
        small()
        .replace("  slot 1\n", "")
        .replace("  batch widths {8, 16} axis 0 rows {aten.mean.dim, aten.mm.default}\n", ""),
        "p.clock",
    )
    assert plain.ok, plain.diagnostics
    assert "lockstep (" not in analysis_tables(plain.analysis)
    doc = analysis_json(plain.analysis)
    assert "batch_widths" not in doc and "graphs" not in doc["callables"][0]
    assert "slot" not in doc["regions"][0]
    fp = footprint(plain.checked, plain.analysis)
    assert "batch" not in plan_text(fp, []) and "batch_widths" not in footprint_json(fp)


def test_check_json_of_a_batched_contract(capsys):
    assert main(["check", "--format", "json", str(GOLDEN)]) == 0
    [entry] = json.loads(capsys.readouterr().out)["contracts"]
    graphs = {k["name"]: k["graphs"] for k in entry["analysis"]["callables"]}
    assert graphs == {"encode": 2, "decode": 4}


# ---------------------------------------------------------------- generated code
def test_emitted_contract_declares_the_lockstep_and_stacks_at_width():
    result = compile_source(small(), "small.clock")
    assert result.ok, result.diagnostics
    source = result.files["contract.py"]
    assert "    BatchDecl,\n" in source
    assert (
        'batch=BatchDecl(widths=(8, 16), axis=0, rows=("aten.mean.dim", "aten.mm.default")),'
        in source
    )
    assert '"slot": 1}' in source
    adapter_source = result.files["adapter.py"]
    assert "    batch=None,\n" in adapter_source and "        batch=batch,\n" in adapter_source
    assert "`batch`: the number of sessions in lockstep this binding serves" in adapter_source

    name, _ = import_package(result.files)
    declared = importlib.import_module(f"{name}.contract").DECLARED
    assert declared.batch_widths == (8, 16)
    assert declared.regions["kv"].slot == 1
    stacked = declared.at_width(16)
    assert stacked.regions["kv"].spec.shape == (2, 16, 8, 4)
    [step] = stacked.callables
    assert sorted(c.args[0].shape for c in step.classes) == [(16, 4), (16, 8)]
    assert declared.at_width(1) is declared
    with pytest.raises(ValueError, match="not declared"):
        declared.at_width(4)


def test_unbatched_contracts_import_and_take_no_batch():
    text = (
        small()
        .replace("  slot 1\n", "")
        .replace("  batch widths {8, 16} axis 0 rows {aten.mean.dim, aten.mm.default}\n", "")
    )
    result = compile_source(text, "plain.clock")
    assert result.ok, result.diagnostics
    assert "BatchDecl" not in result.files["contract.py"]
    assert '"slot"' not in result.files["contract.py"]
    assert "batch" not in result.files["adapter.py"]


def test_regenerating_the_shipped_contracts_changes_nothing(monkeypatch, capsys):
    # the lockstep clauses change nothing for contracts that do not use them
    monkeypatch.chdir(ROOT)
    assert main(["compile", "--check"]) == 0, capsys.readouterr().out


def test_every_lockstep_code_has_an_error_golden():
    expected = {
        "CLK068",
        "CLK100",
        "CLK101",
        "CLK102",
        "CLK103",
        "CLK104",
        "CLK105",
        "CLK106",
        "CLK512",
    }
    found = set()
    for case in list(ERRORS.glob("batch_*.clock")) + list(ERRORS.glob("slot_*.clock")):
        result = check_source(case.read_text(), case.name)
        found |= {d.code for d in result.diagnostics}
    assert expected <= found
