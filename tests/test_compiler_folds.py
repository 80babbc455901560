"""The `fold` statement through the compiler: parse, print, validate, lower, generate.

Its diagnostics with file:line:col (a missing site, an unknown kind, a duplicate name)
are error goldens in tests/errors/fold_*.clock; this file checks the rest: the round
trip, the other refusals, and that the generated contract declares its folds (and
that a contract without folds generates exactly what it did before).
"""

from __future__ import annotations

from duplexcadence.compiler.driver import check_source, compile_source
from duplexcadence.dsl.parser import parse
from duplexcadence.dsl.printer import print_contract
from duplexcadence.runtime import FoldDecl

HEAD = """contract demo
clock chunk = 1 per call
callable decode {
  site vae.decode
  per chunk
  arg z: float32 [1, 4]
}
"""
FOLD = """fold dec_weights {
  site vae.decoder
  by weight_norm
  note "conv weights under weight norm"
}
"""


def codes(text: str) -> list[tuple[str, int]]:
    return [(d.code, d.span.line) for d in check_source(text, "f.clock").diagnostics]


def test_a_fold_prints_and_parses_back_to_the_same_ir() -> None:
    contract, diags = parse(
        HEAD + FOLD + FOLD.replace("dec_weights", "enc").replace("decoder", "encoder")
    )
    assert not diags
    assert [(f.name, f.site.dotted(), f.by) for f in contract.folds] == [
        ("dec_weights", "vae.decoder", "weight_norm"),
        ("enc", "vae.encoder", "weight_norm"),
    ]
    text = print_contract(contract)
    assert "fold enc {\n  site vae.encoder\n  by weight_norm\n" in text
    again, diags = parse(text)
    assert not diags and again.model_dump() == contract.model_dump()


def test_a_fold_is_checked_clean_and_refused_without_by() -> None:
    assert codes(HEAD + FOLD) == []
    assert codes(HEAD + "fold w {\n  site vae.decoder\n}\n") == [("CLK025", 8)]


def test_fold_sites_are_checked_like_other_sites() -> None:
    nested = FOLD + FOLD.replace("dec_weights", "inner").replace("vae.decoder", "vae.decoder.m")
    assert codes(HEAD + nested) == [("CLK051", 14)]
    assert codes(HEAD + FOLD.replace("vae.decoder", "vae.__class__")) == [("CLK050", 9)]
    assert codes(HEAD + FOLD.replace("vae.decoder", "s[id(vae.decoder)]")) == [("CLK055", 9)]
    # a fold changes weights, not the attribute a site names: a callable inside it is fine
    assert codes(HEAD + FOLD.replace("vae.decoder", "vae")) == []
    # but bind() never resolves through what a bound site holds (here a callable)
    assert codes(HEAD + FOLD.replace("vae.decoder", "vae.decode")) == [("CLK051", 9)]


def test_the_generated_contract_declares_its_folds() -> None:
    result = compile_source(HEAD + FOLD, "f.clock")
    assert result.ok, result.diagnostics
    source = result.files["contract.py"]
    assert 'FOLDS = (FoldDecl("dec_weights", "weight_norm", site="vae.decoder"),)' in source
    namespace: dict = {}
    exec(source, namespace)  # the generated module, as data
    assert namespace["DECLARED"].folds == (
        FoldDecl("dec_weights", "weight_norm", site=(("attr", "vae"), ("attr", "decoder"))),
    )
    assert namespace["DECLARED"].sites_to_check()["dec_weights"] == (
        ("attr", "vae"),
        ("attr", "decoder"),
    )


def test_a_contract_without_folds_generates_no_fold_table() -> None:
    source = compile_source(HEAD, "f.clock").files["contract.py"]
    assert "FOLDS" not in source and "FoldDecl" not in source and "folds=" not in source
