"""Print contract IR back to `.clock` text (canonical layout, comments dropped).

Used by the round-trip property (print -> parse gives the same IR) and by
anyone who wants a normalised contract.
"""

from __future__ import annotations

from duplexcadence.dsl import ir


def expr(e: ir.Expr, parent_prec: int = 0) -> str:
    if isinstance(e, ir.Quantity):
        return f"{e.value} {e.unit}" if e.unit else str(e.value)
    if isinstance(e, ir.NameRef):
        return e.name
    if isinstance(e, ir.ExtentOf):
        return f"extent({e.region})"
    if isinstance(e, ir.MaxOf):
        return "max(" + ", ".join(expr(i) for i in e.items) + ")"
    prec = 2 if e.op == "*" else 1
    # left-associative: the right operand needs parentheses at equal precedence
    text = f"{expr(e.left, prec)} {e.op} {expr(e.right, prec + 1)}"
    return f"({text})" if prec < parent_prec else text


def literal(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    return f'"{v}"'


def path(p: ir.Path) -> str:
    return p.dotted()


def dims(ds) -> str:
    return "[" + ", ".join(expr(d) for d in ds) + "]"


def _region(r: ir.Region) -> list[str]:
    out = [f"region {r.name} {{"]
    if r.dtype:
        out.append(f"  dtype {r.dtype}")
    if r.dims is not None:
        out.append(f"  dims {dims(r.dims)}")
    if r.clock:
        out.append(f"  clock {r.clock}")
    out.append(f"  lifetime {r.lifetime}")
    out.append(f"  mutability {r.mutability}")
    if r.retention:
        p = r.retention.params
        text = {
            "ring": lambda: f"ring({expr(p[0])})",
            "window": lambda: f"window({expr(p[0])})",
            "head_tail": lambda: f"head({expr(p[0])}) ++ tail({expr(p[1])})",
        }[r.retention.kind]()
        out.append(f"  retention {text}")
    if r.attended:
        a = r.attended
        line = f"  attended from {expr(a.start)} by {expr(a.stride)}"
        if a.until is not None:
            line += f" until {expr(a.until)}"
        if a.flush:
            line += " flush {" + ", ".join(expr(f) for f in a.flush) + "}"
        out.append(line)
    if r.envelope is not None:
        out.append(f"  envelope {expr(r.envelope)}")
    if r.speculative is not None:
        out.append(f"  speculative {expr(r.speculative)}")
    if r.stock is not None:
        out.append(f"  stock {dims(r.stock)}")
    out.append(f"  address {r.address}")
    if r.allocate != "demand":
        out.append(f"  allocate {r.allocate}")
    if r.site:
        out.append(f"  site {path(r.site)}")
    if r.initial is not None:
        out.append(f"  initial {r.initial}")
    if r.slot is not None:
        out.append(f"  slot {r.slot}")
    if r.note is not None:
        out.append(f'  note "{r.note}"')
    return out + ["}"]


def _arg_type(t) -> str:
    if isinstance(t, ir.RegionArg):
        return f"region {t.region}" + (f"[{t.index}]" if t.index is not None else "")
    if isinstance(t, ir.TensorArg):
        text = f"{t.dtype} {dims(t.dims)}"
        if t.layout == "free":
            return text + " layout free"
        text += f" strides {dims(t.strides)}" if t.strides is not None else ""
        return text + (f" offset {expr(t.offset)}" if t.offset is not None else "")
    if isinstance(t, ir.ObjectArg):
        return f"site {path(t.site)}"
    return t.type


def _callable(k: ir.Callable) -> list[str]:
    out = [f"callable {k.name} {{"]
    if k.site:
        out.append(f"  site {path(k.site)}")
    if k.per:
        out.append(f"  per {k.per}")
    for a in k.args:
        out.append(f"  {'kwarg' if a.keyword else 'arg'} {path(a.path)}: {_arg_type(a.type)}")
    if k.aliased:
        out.append("  aliased " + ", ".join(k.aliased))
    if k.writes:
        out.append("  writes " + ", ".join(k.writes))
    for r in k.retains:
        out.append(f"  retains {r.region} from {path(r.source)}")
    for c in k.configs:
        names = c.names[0] if len(c.names) == 1 else "(" + ", ".join(c.names) + ")"
        values = ", ".join(
            literal(v[0]) if len(v) == 1 else "(" + ", ".join(literal(x) for x in v) + ")"
            for v in c.values
        )
        out.append(f"  config {names} in {{{values}}}")
    for n in k.counters:
        flags = (" staged" if n.staged else "") + (f" tracks {n.tracks}" if n.tracks else "")
        out.append(f"  counter {path(n.site)} advances {expr(n.advances)} from {n.start}{flags}")
    for g in k.guards:
        out.append(f"  guard {path(g.site)} {g.op} {literal(g.value)}")
    for c in k.controls:
        out.append(f"  control {c.name}: {c.dtype} in {c.low}..{c.high} from {path(c.source)}")
    for c in k.commits:
        out.append(f"  commits {c.region} by {expr(c.amount)}")
    for a in k.ambient:
        out.append(f"  ambient {a.axis} in {{{', '.join(a.values)}}}")
    if k.admit:
        out.append(
            "  admit " + " and ".join(f"{expr(c.left)} {c.op} {expr(c.right)}" for c in k.admit)
        )
    out.append(f"  effects {k.effects}")
    out.append(f"  mode {k.mode}")
    if k.batch is not None:
        b = k.batch
        line = "  batch widths {" + ", ".join(map(str, b.widths)) + f"}} axis {b.axis}"
        ops = [op + (f" by {n}" if n > 1 else "") for op, n in zip(b.rows, b.row_blocks())]
        out.append(line + (" rows {" + ", ".join(ops) + "}" if b.rows else ""))
    if k.note is not None:
        out.append(f'  note "{k.note}"')
    return out + ["}"]


def _block(kind: str, name: str, props: list[str], note: str | None) -> list[str]:
    """A `kind name { ... }` block of one property per line, its note last."""
    out = [f"{kind} {name} {{"] + [f"  {p}" for p in props]
    if note is not None:
        out.append(f'  note "{note}"')
    return out + ["}"]


def _constant(h: ir.HostConstant) -> list[str]:
    props = [f"site {path(h.site)}"] if h.site else []
    props += [f"dtype {h.dtype}"] if h.dtype else []
    props += [f"dims {dims(h.dims)}"] if h.dims is not None else []
    return _block("constant", h.name, props + [f"install {h.install}"], h.note)


def _fold(f: ir.Fold) -> list[str]:
    props = [f"site {path(f.site)}"] if f.site else []
    props += [f"by {f.by}"] if f.by else []
    return _block("fold", f.name, props, f.note)


def _channel(ch: ir.Channel) -> list[str]:
    props = [f"dtype {ch.dtype}"] if ch.dtype else []
    props += [f"dims {dims(ch.dims)}"] if ch.dims is not None else []
    props += [f"batch {expr(ch.publish)}"] if ch.publish is not None else []
    props += [f"clock {ch.clock}"] if ch.clock else []
    return _block("channel", ch.name, props, ch.note)


def _param(p: ir.Param) -> str:
    text = f"param {p.name} in {p.lo}..{p.hi}" + (f" {p.unit}" if p.unit else "")
    if p.default is not None:
        text += f" default {p.default}"
    if p.capture:
        text += " capture {" + ", ".join(str(v) for v in p.capture) + "}"
    if p.hold is not None:
        text += f" hold {p.hold}"
    return text


def print_contract(c: ir.Contract) -> str:
    lines = [f"contract {c.name}"]
    if c.target is not None:
        lines.append(f'target "{c.target}"')
    if c.budget is not None:
        lines.append(f"catalog budget {c.budget}")
    for d in c.determinism:
        lines.append(f"determinism {d.setting} = {literal(d.value)}")
    for k in c.clocks:
        if k.kind == "rate":
            lines.append(f"clock {k.name} = {k.rate} per {k.parent}")
        elif k.kind == "stepped" and k.listed:
            lines.append(
                f"clock {k.name} = {{" + ", ".join(map(str, k.listed)) + f"}} per {k.parent}"
            )
        elif k.kind == "stepped":
            lines.append(f"clock {k.name} = {k.steps[0]}..{k.steps[1]} per {k.parent}")
        else:
            lines.append(f"clock {k.name} = (" + ", ".join(k.factors) + ")")
    for p in c.params:
        lines.append(_param(p))
    for const in c.consts:
        lines.append(f"const {const.name} = {expr(const.expr)}")
    for r in c.regions:
        lines.extend(_region(r))
    for k in c.callables:
        lines.extend(_callable(k))
    for h in c.constants:
        lines.extend(_constant(h))
    for f in c.folds:
        lines.extend(_fold(f))
    for ch in c.channels:
        lines.extend(_channel(ch))
    return "\n".join(lines) + "\n"
