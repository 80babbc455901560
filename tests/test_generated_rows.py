"""Generated code as rows: the compact form (dotted sites, RegionTable, CatalogDecl rows)
expands to exactly the declarations the compiler's analysis describes.

The expected objects are built here straight from the IR and the analysis (not from
the lowering, not from a frozen copy of an older file), then compared with what each
shipped `generated/<contract>/contract.py` expands to.
"""

import importlib
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from duplexcadence.compiler.analysis import tensor_layout
from duplexcadence.compiler.driver import check_source
from duplexcadence.compiler.lower import region_installs
from duplexcadence.dsl import ir
from duplexcadence.runtime.audit import named_leaves
from duplexcadence.runtime import (
    CaptureClass,
    CatalogDecl,
    HeadTail,
    OneOf,
    RegionTable,
    RegionView,
    Ring,
    TensorSpec,
    Window,
    parse_path,
)
from duplexcadence.runtime.serving.params import ParamDecl
from duplexcadence.runtime.state.regions import RegionSpec
from duplexcadence.runtime.state.sites import format_path

ROOT = Path(__file__).resolve().parent.parent
CONTRACTS = sorted((ROOT / "contracts").glob("*.clock"))
GENERATED = sorted((ROOT / "generated").glob("*/contract.py"))


def _analysed(path: Path):
    result = check_source(path.read_text(), str(path))
    assert result.ok, result.diagnostics
    module = importlib.import_module(f"duplexcadence.generated.{result.checked.contract.name}")
    return result.checked, result.analysis, module.DECLARED, result.params


def _steps(path: ir.Path, head: tuple | None = None) -> tuple:
    """A contract path as runtime steps; an identity key's module path as nested steps."""
    first = [("attr", path.root)] if head is None else [head]
    value = lambda s: _steps(s.value) if isinstance(s.value, ir.Path) else s.value  # noqa: E731
    return tuple(first + [(s.kind, value(s)) for s in path.steps])


def _leaf(arg: ir.Arg, cls, checked):
    t, config = arg.type, dict(cls.config)
    if isinstance(t, ir.RegionArg):
        index = None if t.index is None else config[t.index]
        return RegionView(t.region, dict(cls.extents).get(t.region), index)
    if isinstance(t, ir.TensorArg):
        # dims may name `extent(R)` (Token2Wav 1.0.7): evaluated at this class's extents
        dims, stride, offset = tensor_layout(t, checked, config, dict(cls.extents))
        dtype = getattr(torch, "bool" if t.dtype == "bool8" else t.dtype)
        return TensorSpec(dims, dtype, stride=stride, offset=offset)
    return None if t.type == "none" else config[arg.path.root]


def _expected_classes(k: ir.Callable, analysis, checked) -> tuple:
    """The capture classes of `k`, in capture order, one per distinct signature."""
    out, seen = [], []
    for cls in sorted(analysis.classes, key=lambda c: (c.extents, sorted(c.config, key=str))):
        args, kwargs = [], {}
        for a in k.args:
            if not a.keyword:
                args.append(_leaf(a, cls, checked))
                continue
            if not a.path.steps:
                kwargs[a.path.root] = _leaf(a, cls, checked)
                continue
            node = kwargs.setdefault(a.path.root, {})
            for s in a.path.steps[:-1]:
                node = node.setdefault(s.value, {})
            node[a.path.steps[-1].value] = _leaf(a, cls, checked)
        key = repr((args, kwargs))  # repr keeps True and 1 apart
        if key not in seen:
            seen.append(key)
            out.append(CaptureClass(cls.label(), tuple(args), kwargs))
    return tuple(out)


@pytest.mark.parametrize("path", CONTRACTS, ids=lambda p: p.stem)
def test_catalog_rows_expand_to_the_analysed_classes(path):
    checked, analysis, declared, _ = _analysed(path)
    by_name = {k.name: k for k in declared.callables}
    for k, ka in zip(checked.contract.callables, analysis.callables):
        expected = _expected_classes(k, ka, checked) if ka.in_scope else ()
        got = by_name[k.name].classes
        assert [c.name for c in got] == [c.name for c in expected], k.name
        assert got == expected, k.name
        # kwargs keep the contract's order (the first leaf a miss reports follows it)
        assert [list(c.kwargs) for c in got] == [list(c.kwargs) for c in expected]


@pytest.mark.parametrize("path", CONTRACTS, ids=lambda p: p.stem)
def test_region_table_and_dotted_sites_expand_to_the_declared_values(path):
    checked, analysis, declared, pa = _analysed(path)
    installs = region_installs(checked.contract)
    plans = {r.name: r for r in analysis.regions}
    retention = {"head_tail": HeadTail, "window": Window, "ring": Ring}
    assert sorted(declared.regions) == sorted(r.name for r in checked.contract.regions)
    for r in checked.contract.regions:
        got, plan = declared.regions[r.name], plans[r.name]
        dtype = getattr(torch, "bool" if r.dtype == "bool8" else r.dtype)
        # session parameters: allocated at the domain's largest shape
        shape = plan.shape if pa is None else pa.shapes[r.name]
        spec = RegionSpec(r.name, dtype, shape, plan.axis, r.lifetime, r.mutability)
        numbers = checked.regions[r.name].retention
        assert got.spec == spec and got.install == installs[r.name]
        assert got.retention == (None if numbers is None else retention[numbers[0]](*numbers[1]))
        assert got.site == (None if r.site is None else _steps(r.site))
        assert got.initial == r.initial  # `initial zeros`, None where the contract says none
        # attended extents and retention sizes shifted per parameter value; () without
        assert got.shift == (() if pa is None else tuple(pa.extent_shift.get(r.name, ())))
        assert got.retention_shift == (
            () if pa is None else tuple(pa.retention_shift.get(r.name, ()))
        )
    assert declared.params == tuple(
        ParamDecl(p.name, p.lo, p.hi, pa.reference[p.name], tuple(p.capture), p.hold)
        for p in sorted(checked.contract.params, key=lambda p: p.name)
    )
    for k, decl in zip(
        sorted(checked.contract.callables, key=lambda k: k.name), declared.callables
    ):
        assert decl.name == k.name and decl.site == _steps(k.site)
        positional = [a for a in k.args if not a.keyword]
        for aliased in decl.aliased:
            [a] = [a for a in k.args if getattr(a.type, "region", None) == aliased.region]
            head = ("key", a.path.root) if a.keyword else ("index", positional.index(a))
            assert aliased.steps == _steps(a.path, head)
        assert [r.steps for r in decl.retains] == [_steps(r.source)[1:] for r in k.retains]
        assert [n.site for n in decl.counters] == [_steps(n.site) for n in k.counters]
        free = [a for a in k.args if getattr(a.type, "layout", None) == "free"]
        assert decl.layout_free == tuple(
            (
                ("kwargs", _steps(a.path, ("key", a.path.root)))
                if a.keyword
                else ("args", _steps(a.path, ("index", positional.index(a))))
            )
            for a in free
        )
    for c, h in zip(declared.constants, sorted(checked.contract.constants, key=lambda h: h.name)):
        assert c.site == (None if h.site is None else _steps(h.site))


# ---------------------------------------------------------------- the compact forms themselves
_KEY = st.text(alphabet="abcXYZ019_ .,:;=+-/()<>%*#@!?'[]{}", max_size=8)
_STEP = st.one_of(
    st.tuples(st.just("attr"), st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,6}", fullmatch=True)),
    st.tuples(st.just("key"), _KEY),
    st.tuples(st.just("index"), st.integers(0, 10**6)),
)


# `states[id(path)]`: an identity key's module path takes attribute and index steps
_MODULE_PATH = st.lists(
    st.one_of(_STEP.filter(lambda s: s[0] != "key")), min_size=1, max_size=4
).map(tuple)
_ANY_STEP = st.one_of(_STEP, st.tuples(st.just("identity"), _MODULE_PATH))


@given(st.lists(_ANY_STEP, min_size=1, max_size=6))
def test_dotted_sites_round_trip(steps):
    """Every path a contract can write (keys in the grammar's string set, identity keys
    by module path) reads back."""
    assert parse_path(format_path(tuple(steps))) == tuple(steps)


def test_identity_site_reads_back_as_nested_steps():
    text = "stream._states[id(vae.decoder.model[2].block[1])]"
    module = (("attr", "vae"), ("attr", "decoder"), ("attr", "model"), ("index", 2))
    assert parse_path(text) == (
        ("attr", "stream"),
        ("attr", "_states"),
        ("identity", module + (("attr", "block"), ("index", 1))),
    )


@pytest.mark.parametrize(
    "text",
    ["", ".a", "a..b", "a.", 'a["b]', "a[-1]", "a[x]", "a.__class__x y", "a b", "a[1"]
    + ["a[id(b)", "a[id()]", "a[id(b)]]", "a[id(.b)]", "a[id b]", "a[id(b))"],
)
def test_malformed_dotted_sites_are_refused(text):
    with pytest.raises(ValueError):
        parse_path(text)


def test_catalog_rows_pick_each_varying_leaf_in_order():
    catalog = CatalogDecl(
        (TensorSpec((1,), torch.float32), OneOf(1, 2)),
        {"c": {"x": OneOf(True, False), "y": None}},
        rows={"a": (0, 1), "b": (1, 0)},
    )
    assert list(catalog) == [
        CaptureClass("a", (TensorSpec((1,), torch.float32), 1), {"c": {"x": False, "y": None}}),
        CaptureClass("b", (TensorSpec((1,), torch.float32), 2), {"c": {"x": True, "y": None}}),
    ]
    assert len(catalog) == 2 and catalog[1].name == "b"


@pytest.mark.parametrize("picks", [(0,), (0, 1, 0), (0, 2), (0, -1), (0, True)])
def test_catalog_rows_with_wrong_picks_are_refused(picks):
    with pytest.raises(ValueError, match="class a"):
        CatalogDecl((OneOf(1, 2), OneOf(3, 4)), rows={"a": picks})


def test_region_table_refuses_a_field_twice_or_unknown():
    common = dict(dtype=torch.float32, lifetime="turn", mutability="mutable", install="allocate")
    table = RegionTable(common, {"r": dict(shape=(2, 3), site="m.buf")})
    assert table["r"].spec == RegionSpec("r", torch.float32, (2, 3), None, "turn", "mutable")
    assert table["r"].site == (("attr", "m"), ("attr", "buf"))
    for row in (dict(shape=(2,), lifetime="session"), dict(shape=(2,), colour=1), dict()):
        with pytest.raises(ValueError, match="region r"):
            RegionTable(common, {"r": row})


def test_token2wav_contracts_shift_regions_with_their_prompt():
    """The parameter comparison above is not vacuous: the Token2Wav contracts declare
    `param f_prompt`, and some of their regions shift with it."""
    for name in ("stepaudio2_token2wav", "stepaudio2_token2wav_step"):
        _, _, declared, pa = _analysed(ROOT / "contracts" / f"{name}.clock")
        assert [p.name for p in declared.params] == ["f_prompt"] and pa is not None
        assert any(r.shift for r in declared.regions.values()), name
        assert any(any(r.retention_shift) for r in declared.regions.values()), name


def test_region_table_passes_the_shifts_and_leaves_them_out_when_unset():
    common = dict(dtype=torch.float32, lifetime="turn", mutability="mutable", install="allocate")
    shift = (("f_prompt", 1),)
    table = RegionTable(
        common,
        {"r": dict(shape=(2,), shift=shift, retention_shift=(shift, ())), "s": dict(shape=(2,))},
    )
    assert table["r"].shift == shift and table["r"].retention_shift == (shift, ())
    assert table["s"].shift == () and table["s"].retention_shift == ()


def test_generated_files_stay_small():
    """Issue 12: every generated file at most 250 lines besides its tables' rows: what
    the contract declares, not boilerplate. A region is two lines (its size comment and
    its entry), a catalog class one (Mimi's encoder: 27 regions, 126 classes), a choice
    of an argument that differs between classes one (its ``OneOf`` entry: the wake's
    depformer, 2 arguments of 16 shapes), and a member of an object argument three more,
    one in each place it is named: its aliasing, its view in the catalog and the object's
    member list (Whisper's decoder: 128 cache tensors, 9 classes)."""
    for path in GENERATED:
        module = importlib.import_module(f"duplexcadence.generated.{path.parent.name}.contract")
        rows = 2 * len(module.REGIONS) + sum(len(c) for c in module.CATALOG.values())
        rows += sum(_choices(c) for c in module.CATALOG.values())
        rows += 3 * sum(len(o.members) for k in module.CALLABLES for o in k.objects)
        assert len(path.read_text().splitlines()) <= 250 + rows, path


def _choices(catalog) -> int:
    """The choices a catalog's ``OneOf`` leaves list: per leaf, its distinct values over
    the classes where they differ."""
    columns: dict[str, set] = {}
    for c in catalog:
        for name, leaf in named_leaves((c.args, dict(c.kwargs)), "call").items():
            columns.setdefault(name, set()).add(repr(leaf))
    return sum(len(v) for v in columns.values() if len(v) > 1)


def test_a_tied_leaf_picks_what_its_leaf_picked_and_a_range_stands_for_its_extents():
    from duplexcadence.runtime import RegionViews

    catalog = CatalogDecl(
        kwargs={
            "k": RegionViews("k", range(0, 6, 2), 5),
            "v": RegionViews("v", range(0, 6, 2), 5, pick_as=0),
            "flag": OneOf(False, True),
        },
        rows={"a": (0, 1), "b": (3, 0)},
    )
    a, b = catalog
    assert a.kwargs == {"k": RegionView("k", 0), "v": RegionView("v", 0), "flag": True}
    assert b.kwargs == {"k": RegionView("k", 5), "v": RegionView("v", 5), "flag": False}
    with pytest.raises(ValueError, match="pick_as=1 before that leaf"):
        CatalogDecl(kwargs={"k": OneOf(1, 2, pick_as=1), "v": OneOf(1, 2)}, rows={"a": (0,)})
