"""Every attack of issue 11, as a regression test.

A `.clock` file is data: nothing in its text or its file name may become code or
reach anything but the model object's own attributes; no input may give a
traceback, hang, or exhaust memory; every number the analysis reports is sound.
"""

import builtins
import os
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest
import torch

from duplexcadence.compiler.cli import main
from duplexcadence.compiler.driver import check_source, compile_source
from duplexcadence.runtime import SiteError, get_at, require_sites, set_at

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fuzzing import run_one  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
HEAD = "contract t\nclock frame = 1 per call\n"


def codes(text: str) -> list[str]:
    return [d.code for d in check_source(text, "attack.clock").diagnostics]


def only(text: str, code: str) -> None:
    """Exactly this one error: positioned, and no follow-on diagnostics."""
    result = check_source(text, "attack.clock")
    errors = [d for d in result.diagnostics if d.severity.value == "error"]
    assert [d.code for d in errors] == [code], result.diagnostics
    assert errors[0].span.line >= 1 and errors[0].span.column >= 1
    assert run_one(text).failure is None


# ---------------------------------------------------------------- code execution
EXEC_VIA_GLOBALS = HEAD + """
callable k {
  site step.__globals__["__builtins__"]["exec"]
  per frame
  arg code: int
  config code in {1}
}
"""


@pytest.mark.parametrize(
    "site",
    [
        'step.__globals__["__builtins__"]["exec"]',
        "step.__builtins__",
        "__class__.__init__",
        "step.__func__.__globals__",
        "step.func_globals",
        "gen.gi_frame.f_globals",
        "model.__dict__",
    ],
)
def test_dunder_and_interpreter_sites_are_refused_at_check(site):
    only(HEAD + f"callable k {{\n  site {site}\n  per frame\n}}\n", "CLK050")


def test_dunder_paths_everywhere_are_refused():
    only(HEAD + "region r {\n  dtype float32\n  dims [1]\n  site a.__class__\n}\n", "CLK050")
    text = (
        HEAD + "callable k {\n  site m.f\n  per frame\n  counter m.__dict__ advances 1 from 0\n}\n"
    )
    only(text, "CLK050")
    text = HEAD + "callable k {\n  site m.f\n  per frame\n  kwarg x.__class__: float32 [1]\n}\n"
    assert "CLK050" in codes(text)


class _Model(torch.nn.Module):
    SHARED = {"k": torch.zeros(1)}  # a class attribute: shared by every instance

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(2, 2)
        self.state = {"kv": torch.zeros(2)}
        self.torch_module = torch  # a module held as an attribute
        self.fn = lambda x: x  # a function held as an attribute
        self.register_buffer("buf", torch.zeros(3))

    def step(self, x):
        return x


@pytest.mark.parametrize(
    "steps, why",
    [
        ((("attr", "fn"), ("attr", "__globals__")), "a function"),
        ((("attr", "step"), ("attr", "__globals__")), "of its own"),
        ((("attr", "__class__"), ("attr", "__init__")), "no `__` names"),
        ((("attr", "torch_module"), ("attr", "nn")), "a module"),
        ((("attr", "fn"), ("attr", "x")), "a function"),
        ((("attr", "SHARED"), ("key", "k")), "of its own"),
        ((("attr", "buf"), ("attr", "data")), "a tensor"),
        ((("attr", "training"),), None),  # an own attribute: fine
    ],
)
def test_runtime_resolves_only_the_models_own_tree(steps, why):
    model = _Model()
    if why is None:
        get_at(model, steps)
        return
    with pytest.raises(SiteError, match=why):
        get_at(model, steps)
    with pytest.raises(SiteError):
        set_at(model, steps, 1)


def test_runtime_writes_only_the_object_itself_and_checks_first():
    model = _Model()
    before_class = dict(vars(_Model))
    with pytest.raises(SiteError, match="nothing was changed"):
        require_sites(
            model,
            {
                "ok": (("attr", "step"),),
                "escape": (("attr", "torch_module"), ("attr", "add")),
            },
        )
    set_at(model, (("attr", "step"),), lambda x: x + 1)  # an instance attribute
    assert dict(vars(_Model)) == before_class  # the class is untouched
    assert _Model().step(1) == 1
    assert get_at(model, (("attr", "lin"), ("attr", "weight"))).shape == (2, 2)
    assert get_at(model, (("attr", "state"), ("key", "kv"))).shape == (2,)
    # a builtin reachable only through its module is out of reach
    with pytest.raises(SiteError, match="a module"):
        get_at(types.SimpleNamespace(b=builtins), (("attr", "b"), ("attr", "exec")))


def test_sites_missing_for_one_reason_are_named_a_few_at_a_time():
    """A contract of 130 cache tensors bound to the wrong object: one readable line."""
    sites = {f"k{i}": (("attr", "state"), ("key", f"k{i}")) for i in range(130)}
    sites["lin"] = (("attr", "lin"), ("attr", "bias"), ("attr", "x"))
    with pytest.raises(SiteError) as e:
        require_sites(types.SimpleNamespace(lin=torch.nn.Linear(2, 2)), sites)
    text = str(e.value)
    assert 'k0 at state["k0"]; k1 at state["k1"]; k2 at state["k2"] and 127 more' in text
    assert "lin at lin.bias.x" in text and text.endswith("(nothing was changed)")
    assert len(text) < 600, text


def test_newline_in_file_name_cannot_inject_code(tmp_path):
    evil = tmp_path / 'x\nopen("pwned", "w")\n#.clock'
    evil.write_text((ROOT / "tests/golden/streaming_cache/contract.clock").read_text())
    out = tmp_path / "out"
    assert main(["compile", str(evil), "-o", str(out)]) == 0
    for source in (out / "streaming_cache").glob("*.py"):
        lines = source.read_text().splitlines()
        assert lines[0].startswith("# Code generated by clockc") and lines[1] == "# @generated"
        compile(source.read_text(), str(source), "exec")
    subprocess.run(
        [sys.executable, "-c", "import streaming_cache"], cwd=out, check=True, capture_output=True
    )
    assert not (out / "pwned").exists()


def test_newline_in_file_name_is_escaped_in_diagnostics(tmp_path, capsys):
    evil = tmp_path / "a\nb.clock"
    evil.write_text("contract c\nregion r {\n  dims [1]\n}\n")
    assert main(["check", str(evil)]) == 1
    err = capsys.readouterr().err
    assert "a\\nb.clock:2:" in err and "\na\nb" not in err


@pytest.mark.parametrize(
    "decl",
    [
        "callable x_body {\n  site m.f\n  per frame\n}",
        "region stock_x {\n  dtype float32\n  dims [1]\n}",
        "constant REGIONS {\n  site m.t\n}",
        "region bind_contract {\n  dtype float32\n  dims [1]\n}",
    ],
)
def test_names_that_shadow_generated_code_are_refused(decl):
    only(HEAD + decl + "\n", "CLK017")


@pytest.mark.parametrize("name", ["set_at", "update_at", "isinstance", "list"])
def test_names_reach_generated_code_only_as_string_keys(name):
    """Generated code is data: a region named after a runtime helper or a builtin is a
    dict key there, never an identifier, so it shadows nothing."""
    result = compile_source(
        HEAD + f"region {name} {{\n  dtype float32\n  dims [1]\n}}\n", "n.clock"
    )
    assert result.ok
    assert f'"{name}": {{' in result.files["contract.py"]
    assert f"{name} =" not in result.files["contract.py"]


@pytest.mark.parametrize("name", ["json", "torch", "os", "duplexcadence", "import", "match"])
def test_contract_names_that_shadow_packages_are_refused(name):
    assert "CLK017" in codes(f"contract {name}\n")


# ---------------------------------------------------------------- limits: no traceback, no hang
def test_integer_over_4300_digits():
    only(HEAD + "const x = " + "9" * 5000 + "\n", "CLK007")


@pytest.mark.parametrize(
    "expr", [" + ".join(["1"] * 500), "max(" * 500 + "1" + ")" * 500, "(" * 500 + "1" + ")" * 500]
)
def test_deep_expressions(expr):
    text = HEAD + f"const x = {expr}\n"
    began = time.perf_counter()
    result = check_source(text, "deep.clock")
    assert time.perf_counter() - began < 1
    # accepted, the header-only contract warns that it declares no callable (CLK509)
    assert [d.code for d in result.diagnostics] in (["CLK008"], ["CLK509"])


def test_slot_index_on_a_region_without_dims():
    text = HEAD + (
        "region r {\n  dtype float32\n  dims []\n}\n"
        "callable k {\n  site m.f\n  per frame\n  arg x: region r[i]\n  config i in {0}\n}\n"
    )
    only(text, "CLK046")


def test_huge_configuration_product_is_refused_quickly():
    values = ", ".join(map(str, range(100)))
    configs = "".join(f"  config {v} in {{{values}}}\n" for v in "abcd")
    text = HEAD + f"callable k {{\n  site m.f\n  per frame\n{configs}  mode eager\n}}\n"
    began = time.perf_counter()
    assert "CLK032" in codes(text)
    assert time.perf_counter() - began < 1


@pytest.mark.parametrize("target", ["/dev/zero", "/dev/urandom"])
def test_link_to_an_endless_device(tmp_path, capsys, target):
    link = tmp_path / "x.clock"
    link.symlink_to(target)
    began = time.perf_counter()
    assert main(["check", str(link)]) == 1
    assert time.perf_counter() - began < 1
    err = capsys.readouterr().err
    assert "error[CLK005]: cannot read contract: not a regular file" in err
    assert ":0:0:" not in err and "Error:" not in err


def test_fifo_directory_large_and_binary_files(tmp_path, capsys):
    fifo = tmp_path / "pipe.clock"
    os.mkfifo(fifo)
    big = tmp_path / "big.clock"
    big.write_text("contract c\n" + "#" * (2 << 20))
    binary = tmp_path / "bin.clock"
    binary.write_bytes(b"contract \xff\xfe\n")
    began = time.perf_counter()
    assert main(["check", str(fifo), str(big), str(binary)]) == 1
    assert time.perf_counter() - began < 2
    err = capsys.readouterr().err
    assert "pipe.clock: error[CLK005]" in err
    assert "big.clock: error[CLK006]" in err
    assert "bin.clock: error[CLK005]: cannot read contract: not UTF-8" in err


def test_output_folder_problems_are_one_line(tmp_path, capsys):
    contract = str(ROOT / "tests/golden/streaming_cache/contract.clock")
    a_file = tmp_path / "f"
    a_file.write_text("")
    for output in (str(a_file), str(a_file / "sub"), "a\0b", ""):
        assert main(["compile", contract, "-o", output]) == 2
        err = capsys.readouterr().err
        assert err.startswith("clockc: ") and err.count("\n") == 1 and "Traceback" not in err
    # --check against a package folder whose file is a directory: drift, not a traceback
    (tmp_path / "o" / "streaming_cache" / "adapter.py").mkdir(parents=True)
    assert main(["compile", contract, "-o", str(tmp_path / "o"), "--check"]) == 1
    assert "drift" in capsys.readouterr().out


@pytest.mark.parametrize("window, value", [("2147483648", 2**31), ("4194304 * 1073741824", 2**52)])
def test_huge_windows_answer_in_closed_form(window, value):
    text = HEAD + (
        "region r {\n  dtype float32\n  dims [frame]\n"
        f"  retention window({window} frame)\n  attended from 0 frame by 1 frame\n}}\n"
        "callable k {\n  site m.f\n  per frame\n  arg x: region r\n  mode eager\n}\n"
    )
    began = time.perf_counter()
    result = check_source(text, "w.clock")
    assert time.perf_counter() - began < 1
    [r] = result.analysis.regions
    [k] = result.analysis.callables
    assert r.catalog_width == value + 1 and r.attended == ()
    assert k.width == k.bound == value + 1
    assert [d.code for d in result.diagnostics] == ["CLK501"]
    assert str(value + 1) in result.diagnostics[0].message


def test_window_of_10_to_the_40_is_refused():
    text = HEAD + "region r {\n  dtype float32\n  dims [frame]\n"
    only(text + "  retention window(" + "1" + "0" * 40 + " frame)\n}\n", "CLK007")
    only(text + "  retention window(1000000000 * 1000000000 frame)\n}\n", "CLK018")


def test_region_too_large_is_refused_not_allocated():
    text = HEAD + "region r {\n  dtype float32\n  dims [100000000, 100000000, 100000000]\n}\n"
    only(text, "CLK018")


# ---------------------------------------------------------------- sound numbers
@pytest.mark.parametrize(
    "retention",
    ["head(2 frame - 5 frame) ++ tail(4 frame)", "head(0 frame) ++ tail(0 frame)", "ring(0 frame)"],
)
def test_negative_or_empty_retention(retention):
    text = HEAD + (
        f"region r {{\n  dtype float32\n  dims [frame]\n  retention {retention}\n"
        "  attended from 0 frame by 1 frame\n}\n"
    )
    only(text, "CLK020")


def test_unused_config_variable_does_not_widen_the_catalog():
    text = HEAD + (
        "callable k {\n  site m.f\n  per frame\n  kwarg flag: bool\n"
        "  config flag in {false, true}\n  config unused in {1, 2, 3}\n}\n"
    )
    result = check_source(text, "u.clock")
    assert result.ok
    [k] = result.analysis.callables
    assert (k.q_size, k.width, k.bound) == (2, 2, 2)
    assert [d.code for d in result.diagnostics] == ["CLK503"]


def test_no_follow_on_after_a_unit_error():
    text = HEAD + (
        "clock chunk = 1 per call\nconst f = 3 chunk\n"
        "region r {\n  dtype float32\n  dims [frame]\n  retention window(f)\n"
        "  attended from 0 frame by 1 frame\n}\n"
        "region s {\n  dtype float32\n  dims [frame]\n  envelope extent(r) + 1 frame\n}\n"
        "callable k {\n  site m.f\n  per frame\n  arg x: region r\n  retains r from result[0]\n}\n"
    )
    only(text, "CLK012")


def test_nested_argument_keys_compile_and_bind():
    text = HEAD + (
        "callable k {\n  site m.f\n  per frame\n"
        '  kwarg cache["a"]["x"]: float32 [1]\n  kwarg cache["b"]["x"]: float32 [2]\n}\n'
    )
    result = compile_source(text, "n.clock")
    assert result.ok, result.diagnostics
    namespace: dict = {}
    exec(result.files["contract.py"], namespace)  # the generated module, as data
    [cls] = namespace["CATALOG"]["k"]
    assert cls.kwargs["cache"]["a"]["x"].shape == (1,)
    assert cls.kwargs["cache"]["b"]["x"].shape == (2,)
    assert run_one(text).bound


def test_overlapping_argument_paths_are_refused():
    text = HEAD + (
        "callable k {\n  site m.f\n  per frame\n"
        '  kwarg cache: float32 [1]\n  kwarg cache["a"]: float32 [2]\n}\n'
    )
    only(text, "CLK010")


def test_conflicting_sites_are_refused():
    text = HEAD + (
        "region r {\n  dtype float32\n  dims [1]\n  site m\n}\n"
        "callable k {\n  site m.f\n  per frame\n}\n"
    )
    only(text, "CLK051")


def test_header_does_not_depend_on_cwd_or_install(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    args = ["compile", "--check", str(ROOT / "contracts"), "-o", str(ROOT / "generated")]
    assert main(args) == 0, capsys.readouterr().out
