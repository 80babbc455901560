"""The contract fuzzer: inputs, the properties every input must satisfy, a fake model.

Used by the short run in the test suite (`test_fuzz_contracts.py`) and by the long
run (`tests/fuzz_contracts.py --minutes 20`). Inputs come from two sources:

  * a grammar fuzzer: `hypothesis.extra.lark.from_lark` over `dsl/clock.lark`, with
    every terminal followed by a space and names drawn from a small pool (so
    references resolve and the dangerous names of issue 11 come up);
  * a mutation fuzzer: token and line edits of the shipped contracts, the golden
    contract and the small seeds in `tests/fuzz_seeds/`.

Properties (`run_one`), for every input:
  1. no uncaught exception: every failure is a positioned diagnostic (or a
     file-level one, line 0, for reading);
  2. `check` and `compile` agree: same diagnostics, files exactly when `check` is ok;
  3. every accepted contract's package imports, and `bind()`s on CPU to a fake model
     built from its IR (objects and dicts at the declared sites, tensors of the
     declared shapes, callables that accept anything and return the retained
     histories), every catalog class materialises, and every callable runs once
     through its wrapper; `unbind()` puts the callables back.
"""

from __future__ import annotations

import random
import re
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import torch
from hypothesis import strategies as st
from hypothesis.extra.lark import from_lark

from duplexcadence.compiler.driver import Result, check_source, compile_source
from duplexcadence.compiler.loader import forget, import_generated
from duplexcadence.dsl import ir
from duplexcadence.dsl.parser import _parser

ROOT = Path(__file__).resolve().parent.parent
SEEDS = sorted((ROOT / "contracts").glob("*.clock")) + sorted(
    (ROOT / "tests" / "golden").glob("*/contract.clock")
)
SEEDS += sorted((ROOT / "tests" / "fuzz_seeds").glob("*.clock"))
REGRESSIONS = ROOT / "tests" / "fuzz_regressions"
BIND_BYTES_LIMIT = 64 << 20  # bigger contracts are checked and compiled, not bound on CPU
TORCH_DTYPE = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float64": torch.float64,
    "int64": torch.int64,
    "int32": torch.int32,
    "int16": torch.int16,
    "int8": torch.int8,
    "uint8": torch.uint8,
    "bool8": torch.bool,
}

# ---------------------------------------------------------------- inputs
NAMES = ["a", "b", "c", "r", "k", "x", "frame", "chunk", "step", "call", "i", "n", "cache"]
DANGEROUS_NAMES = [
    "set_at",
    "update_at",
    "get_at",
    "model",
    "binding",
    "torch",
    "list",
    "isinstance",
    "import",
    "match",
    "stock_x",
    "x_body",
    "_private",
    "__class__",
    "__globals__",
    "__builtins__",
    "__init__",
    "func_globals",
    "gi_frame",
    "json",
    "os",
]
INTERESTING_INTS = [0, 1, 2, 3, 7, 64, 1000, 2**31, 2**31 - 1, 2**53, 2**53 + 1, 10**15, 10**16]


def grammar_strategy() -> st.SearchStrategy[str]:
    """Strings of the contract grammar, tokens separated by spaces."""
    spaced = {
        "WS": st.sampled_from([" ", "\n", "\t", "\r\n"]),
        "COMMENT": st.sampled_from(["# c\n", "#\n", "# __globals__ exec\n"]),
    }
    for t in _parser().terminals:
        if t.name in spaced:
            continue
        if t.pattern.type == "str":
            base = st.just(t.pattern.value)
        elif t.name == "NAME":
            base = st.sampled_from(NAMES + DANGEROUS_NAMES)
        elif t.name == "INT":
            base = st.one_of(st.integers(0, 99), st.sampled_from(INTERESTING_INTS)).map(str)
        elif t.name == "OP_NAME":  # `rows {...}` of a batch: ATen names, and ones that are not
            base = st.sampled_from(["aten.mean.dim", "aten.mm.default", "aten.mean", "mean", "x.y"])
        elif t.name == "MODULE_PATH":  # `aten.mm.default in gating`: a module scope
            base = st.sampled_from(["gating", "transformer.layers.*.gating", "*", "a.0.b"])
        elif t.name == "STRING":
            base = st.sampled_from(['"x"', '"a b"', '"key"', '"estimator_att_cache"', '""'])
        else:  # a keyword class: one of its alternatives
            words = re.findall(r"[A-Za-z_0-9<>=!]+", t.pattern.value.replace("?:", ""))
            base = st.sampled_from(words)
        spaced[t.name] = base.map(lambda s: s + " ")
    text = from_lark(_parser(), explicit=spaced)
    # most inputs get a header, so validation (not only parsing) is exercised
    return st.one_of(text, text.map(lambda s: "contract c\n" + s))


_TOKEN = re.compile(r'"[^"\n]*"|#[^\n]*|[A-Za-z_][A-Za-z0-9_]*|[0-9]+|\+\+|<=|>=|==|!=|\S|\n')
_KEYWORD_FAMILIES = [
    ["operator", "unit", "chunk", "turn", "session", "process"],
    ["immutable", "mutable", "copy_on_write"],
    ["stable", "moves", "pinned"],
    ["demand", "stock"],
    ["none", "device_rng", "host_rng"],
    ["replay", "eager"],
    ["device_buffer", "hoisted", "left_eager"],
    ["float32", "float16", "bfloat16", "float64", "int64", "int32", "int8", "uint8", "bool8"],
    ["ring", "window", "head"],
    ["arg", "kwarg"],
    ["true", "false"],
    ["<=", "<", "==", "!=", ">=", ">"],
]


def mutate(text: str, rnd: random.Random, donors: list[str]) -> str:
    """One to three token or line edits of a contract."""
    for _ in range(rnd.randint(1, 3)):
        edit = rnd.randrange(10)
        lines = text.split("\n")
        if edit == 0 and len(lines) > 1:  # delete a line
            del lines[rnd.randrange(len(lines))]
            text = "\n".join(lines)
        elif edit == 1:  # duplicate a line elsewhere
            line = rnd.choice(lines)
            lines.insert(rnd.randrange(len(lines) + 1), line)
            text = "\n".join(lines)
        elif edit == 2 and donors:  # a line of another contract
            donor = rnd.choice(donors).split("\n")
            lines.insert(rnd.randrange(len(lines) + 1), rnd.choice(donor))
            text = "\n".join(lines)
        else:
            tokens = _TOKEN.findall(text)
            if not tokens:
                continue
            i = rnd.randrange(len(tokens))
            tok = tokens[i]
            if edit == 3 and tok.isdigit():
                tokens[i] = str(rnd.choice(INTERESTING_INTS + [rnd.randint(0, 600)]))
            elif edit == 4 and re.match(r"[A-Za-z_]", tok):
                words = [t for t in tokens if re.match(r"[A-Za-z_]\w*$", t)]
                tokens[i] = rnd.choice(words + DANGEROUS_NAMES)
            elif edit == 5:
                family = next((f for f in _KEYWORD_FAMILIES if tok in f), None)
                if family:
                    tokens[i] = rnd.choice(family)
            elif edit == 6:
                del tokens[i]
            elif edit == 7:
                tokens.insert(i, tok)
            elif edit == 8 and tok.isdigit():
                tokens[i] = f"{tok} {rnd.choice(['+', '-', '*'])} {rnd.randint(0, 300)}"
            else:
                j = rnd.randrange(len(tokens))
                tokens[i], tokens[j] = tokens[j], tokens[i]
            text = _join(tokens)
    return text


def _join(tokens: list[str]) -> str:
    out = []
    for t in tokens:
        if t == "\n" or not out or out[-1].endswith("\n"):
            out.append(t)
        else:
            out.append(" " + t)
    return "".join(out)


# ---------------------------------------------------------------- properties
@dataclass
class Outcome:
    accepted: bool = False
    bound: bool = False
    skipped_bind: str | None = None
    failure: str | None = None  # a property that did not hold (with traceback)
    seconds: float = 0.0  # the compiler: check + compile
    bind_seconds: float = 0.0  # import, fake model, bind, materialise, one call each
    codes: list[str] = field(default_factory=list)


class PropertyFailure(AssertionError):
    pass


def run_one(text: str, *, bind: bool = True) -> Outcome:
    """Run every property on one input; never raises (the failure is in the outcome)."""
    out = Outcome()
    try:
        _properties(text, out, bind=bind)
    except Exception:  # noqa: BLE001 - any exception is a finding
        out.failure = traceback.format_exc()
    return out


def _properties(text: str, out: Outcome, *, bind: bool) -> None:
    began = time.perf_counter()
    checked = check_source(text, "fuzz.clock")
    out.codes = sorted({d.code for d in checked.diagnostics})
    for d in checked.diagnostics:
        if d.span.line < 1 or d.span.column < 1:
            raise PropertyFailure(f"diagnostic without a position: {d}")
    compiled = compile_source(text, "fuzz.clock")
    out.seconds = time.perf_counter() - began
    if [_key(d) for d in compiled.diagnostics] != [_key(d) for d in checked.diagnostics]:
        raise PropertyFailure("check and compile disagree on the diagnostics")
    if checked.ok != bool(compiled.files):
        raise PropertyFailure(
            f"check ok={checked.ok} but compile wrote {len(compiled.files)} files"
        )
    if not checked.ok:
        return
    out.accepted = True
    nbytes = _bind_bytes(compiled)
    if not bind:
        out.skipped_bind = "not asked"
        return
    if nbytes > BIND_BYTES_LIMIT:
        out.skipped_bind = f"{nbytes >> 20} MiB"
        return
    began = time.perf_counter()
    bind_on_fake_model(compiled)
    out.bound = True
    out.bind_seconds = time.perf_counter() - began


def _key(d) -> tuple:
    return (d.severity, d.code, d.message, d.span)


def _bind_bytes(r: Result) -> int:
    regions = sum(2 * (x.stock_bytes or x.demand_bytes) for x in r.analysis.regions)
    return regions + sum(k.staging_bytes for k in r.analysis.callables)


def import_package(files: dict[str, str]):
    """Import a generated package from a temporary folder under a fresh name."""
    module = import_generated(files, prefix="fuzzpkg")
    return module.__name__, module


def compiled_adapter(source: str, path: str):
    """The generated adapter module of a contract text that must compile."""
    import importlib

    result = compile_source(source, path)
    assert result.ok, result.diagnostics
    name, _ = import_package(result.files)
    return importlib.import_module(f"{name}.adapter")


def bind_on_fake_model(r: Result) -> None:
    from duplexcadence.runtime import materialize

    _, adapter = import_package(r.files)
    try:
        model, stock_callables = FakeModel.build(r)
        binding = adapter.bind(model, device="cpu", progress=False)
        for k in r.contract.callables:
            classes = adapter.CATALOG[k.name]
            for cls in classes:
                materialize(cls, binding.regions, torch.device("cpu"), None)
            if classes:
                args, kwargs, _ = materialize(
                    classes[0], binding.regions, torch.device("cpu"), None
                )
                wrapper = _get(model, k.site)
                wrapper(*args, **kwargs)
        if len(binding.folds) != len(r.contract.folds):
            raise PropertyFailure("bind() did not apply every fold")
        binding.unbind()
        for f in r.contract.folds:
            if not torch.nn.utils.parametrize.is_parametrized(_get(model, f.site).conv):
                raise PropertyFailure(f"unbind() did not restore fold {f.name}")
        for k in r.contract.callables:
            if _get(model, k.site) is not stock_callables[k.name]:
                raise PropertyFailure(f"unbind() did not restore callable {k.name}")
    finally:
        forget(adapter)


def _steps(path: ir.Path) -> list[tuple[str, object]]:
    return [("attr", path.root)] + [(s.kind, s.value) for s in path.steps]


def _get(model, path: ir.Path):
    node = model
    for kind, key in _steps(path):
        if kind == "identity":  # `[id(path)]`: keyed by the module at that path
            key = id(_get(model, key))
        node = getattr(node, key) if kind == "attr" else node[key]
    return node


class FakeNode(dict):
    """An object with attributes and items: whatever a site path asks of it."""


class FakeModel:
    """A model matching a contract's IR: built leaf by leaf at the declared sites."""

    @staticmethod
    def build(r: Result):
        root = FakeNode()
        regions = {x.name: x for x in r.analysis.regions}
        numbers = r.checked.regions

        def module_at(path: ir.Path) -> torch.nn.Module:
            """The module an identity key names: placed at its path where absent."""
            try:
                found = _get(root, path)
            except (AttributeError, KeyError, IndexError, TypeError):
                found = None
            if not isinstance(found, torch.nn.Module):
                found = torch.nn.Module()
                place(path, found)
            return found

        def place(path: ir.Path, value) -> None:
            steps = [
                (kind, id(module_at(key)) if kind == "identity" else key)
                for kind, key in _steps(path)
            ]
            node = root
            for kind, key in steps[:-1]:
                # an attribute not set yet is absent: getattr would find a dict method
                # of the node itself (a site through `values` or `keys`)
                nxt = vars(node).get(key) if kind == "attr" else node.get(key)
                if nxt is None:
                    nxt = FakeNode()
                    if kind == "attr":
                        setattr(node, key, nxt)
                    else:
                        node[key] = nxt
                node = nxt
            kind, key = steps[-1]
            if kind == "attr":
                setattr(node, key, value)
            else:
                node[key] = value

        for f in r.contract.folds:  # first: identity keys below may lie inside
            place(f.site, _weight_normed_module())
        for region in r.contract.regions:
            if region.site is None:
                continue
            a, n = regions[region.name], numbers[region.name]
            shape = list(a.shape)
            if n.retention is not None and region.address != "pinned":
                shape[a.axis] = a.start  # the primed history a carry adopts
            elif n.stock is not None and region.address != "pinned":
                shape = list(n.stock)
            place(region.site, torch.zeros(shape, dtype=TORCH_DTYPE[region.dtype]))
        for h in r.contract.constants:
            if h.site is not None and h.install == "device_buffer":
                place(h.site, torch.zeros(16))
        stock_callables = {}
        for k in r.contract.callables:
            fn = _fake_callable(k, regions, numbers)
            stock_callables[k.name] = fn
            place(k.site, fn)
            for counter in k.counters:
                place(counter.site, counter.start)
            for guard in k.guards:  # the value the graphs are for: every call replays
                place(guard.site, guard.value)
        return root, stock_callables


def _weight_normed_module() -> torch.nn.Module:
    """What a fold's site holds: a module with one weight-normed submodule."""
    from torch.nn.utils.parametrizations import weight_norm

    module = torch.nn.Module()
    module.conv = weight_norm(torch.nn.Conv1d(2, 2, 1))
    return module


def _fake_callable(k: ir.Callable, regions, numbers):
    """A stock callable that accepts any arguments and returns, at every `retains`
    path, a history of the retained region's shape."""
    structure = None
    for ret in k.retains:
        a, n = regions[ret.region], numbers[ret.region]
        shape = list(a.shape)
        grow = max(n.stride or 1, 1)
        shape[a.axis] = grow if n.retention[0] == "ring" else (n.bound or 0) + grow
        leaf = ("tensor", tuple(shape), a.dtype)
        structure = _merge(structure, [(s.kind, s.value) for s in ret.source.steps], leaf)

    def stock(*args, **kwargs):
        return _realise(structure) if structure is not None else None

    return stock


def _merge(node, steps, leaf):
    if not steps:
        return leaf
    kind, key = steps[0]
    if node is None:
        node = {"kind": kind, "items": {}}
    node["items"][key] = _merge(node["items"].get(key), steps[1:], leaf)
    return node


def _realise(node):
    if isinstance(node, tuple):
        return torch.zeros(node[1], dtype=TORCH_DTYPE[node[2]])
    items = {key: _realise(child) for key, child in node["items"].items()}
    if node["kind"] == "index":
        length = max(items) + 1
        return tuple(items.get(i) for i in range(length))
    if node["kind"] == "key":
        return dict(items)
    obj = FakeNode()
    for key, value in items.items():
        setattr(obj, key, value)
    return obj
