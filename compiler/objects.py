"""State-object arguments (CLK058): `kwarg past: site cache` expanded into regions.

A vendor that keeps its stream state in Python objects (transformers' ``DynamicCache``
with its layers' ``keys``/``values``, ``MimiConv1dPaddingCache.padding_cache[i]``)
passes the object itself to the hot call. A catalog describes arguments as nested
dicts of tensors, so validation turns the object argument into what the runtime keys:
one region argument ``past["R"]`` for every region ``R`` whose site lies under the
object's site (the object's own tensors, at the addresses bind gave them), aliased:
admission pins each member's pointer. The vendor rebinds the members on every call;
the runtime copies them back (runtime/serving/state_objects.py). The
expansion is recorded in ``Callable.objects`` so the runtime knows which argument is
the object and which of its sites each member is.

Everything else the object holds (host ints, config lists) is the model's own state:
counters name the host ints; nothing else becomes part of a signature.
"""

from __future__ import annotations

from duplexcadence.compiler.sites import path_key
from duplexcadence.dsl import ir
from duplexcadence.dsl.diagnostics import Diagnostic, error


def _under(site: ir.Path, prefix: ir.Path) -> bool:
    """Whether ``site`` lies strictly inside ``prefix``."""
    inner, outer = path_key(site), path_key(prefix)
    return len(inner) > len(outer) and inner[: len(outer)] == outer


def _expand_arg(
    k: ir.Callable, a: ir.Arg, regions: tuple[ir.Region, ...], diags: list[Diagnostic]
) -> tuple[list[ir.Arg], ir.StateObject | None]:
    site = a.type.site  # type: ignore[union-attr]
    where = f"object argument '{a.path.dotted()}' of callable '{k.name}'"
    if a.path.steps or not a.keyword:
        diags.append(
            error(
                "CLK058",
                f"{where}: an object argument is a whole keyword argument (`kwarg NAME`)",
                a.span,
            )
        )
        return [], None
    members = [r for r in regions if r.site is not None and _under(r.site, site)]
    if not members:
        diags.append(
            error(
                "CLK058",
                f"{where}: no region has its site under '{site.dotted()}' "
                "(declare the object's tensors as regions at sites inside it)",
                a.type.span,
            )
        )
        return [], None
    args = [
        ir.Arg(
            path=ir.Path(
                root=a.path.root,
                steps=(ir.PathStep(kind="key", value=r.name),),
                span=a.path.span,
            ),
            keyword=a.keyword,
            type=ir.RegionArg(region=r.name, span=a.type.span),
            span=a.span,
        )
        for r in members
    ]
    obj = ir.StateObject(arg=a.path, site=site, members=tuple(r.name for r in members))
    return args, obj


def expand_objects(contract: ir.Contract) -> tuple[ir.Contract, list[Diagnostic]]:
    """The contract with every object argument expanded (module docstring); a contract
    without one comes back as it is."""
    diags: list[Diagnostic] = []
    callables = []
    for k in contract.callables:
        if not any(isinstance(a.type, ir.ObjectArg) for a in k.args):
            callables.append(k)
            continue
        args: list[ir.Arg] = []
        objects: list[ir.StateObject] = []
        for a in k.args:
            if not isinstance(a.type, ir.ObjectArg):
                args.append(a)
                continue
            member_args, obj = _expand_arg(k, a, contract.regions, diags)
            args += member_args
            if obj is not None:
                objects.append(obj)
        named = [m for o in objects for m in o.members]
        callables.append(
            k.model_copy(
                update={
                    "args": tuple(args),
                    "objects": tuple(objects),
                    "aliased": tuple(dict.fromkeys((*k.aliased, *named))),
                }
            )
        )
    if not any(k.objects for k in callables) and not diags:
        return contract, diags
    return contract.model_copy(update={"callables": tuple(callables)}), diags
