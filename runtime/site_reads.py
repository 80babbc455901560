"""Compiled site reads: many sites of one root, read on every call at the cost of plain lookups.

Contract of this layer. ``SiteReads(root, sites).read()`` returns the values at
``sites`` (paths from ``root``, sites.py), in order, exactly as ``get_at`` would give
them now. ``get_at`` checks the path rules (sites.py: a path stays in the object's
own tree) at every step of every read; on a replayed call that checks every
write-through site (admission clause ii) this was most of the host time: VoxCPM2's
26 identity-keyed sites (``stream._states[id(vae.decoder.model[2].block[2].block[1])]``,
up to 12 steps each) took ~1.8 ms of host time per call on a CPU.

The rules are about the objects a path passes through, so they are checked once per
chain of objects. The first ``read()`` resolves every site with ``get_at`` (raising
its ``SiteError``) and records every object the paths pass through. Every later read
retakes each step with the lookup the checked step resolved to (``getattr(obj,
name)``, ``obj[key]``, ``obj[id(module)]``) and accepts the values only if every
object passed through *is* the one recorded. The recorded objects are held, so their
ids cannot be reused by other objects. Any other object, or a lookup that fails, and
the read starts over with ``get_at`` for every site (``checks`` counts these): a model
whose tree changed is read, checked and refused exactly as ``get_at`` refuses it.
Prefixes shared by several sites are walked once per read.

The value at a site itself (the last step's result) is read, never compared: the
caller checks it (admission compares each write-through tensor's pointer, shape,
stride and dtype with the captured ones).
"""

from __future__ import annotations

from typing import Any, Mapping

from .sites import Step, get_at

_ATTR, _ITEM, _IDENTITY = 0, 1, 2
_LEAF = object()  # the value at a site: read, not compared


class SiteReads:
    def __init__(self, root: Any, sites: Mapping[str, tuple[Step, ...]]) -> None:
        self.root = root
        self.names = tuple(sites)
        self.sites = tuple(sites.values())
        # one instruction per distinct step: (parent node, op, name/key or module
        # node, the object recorded there or _LEAF); node 0 is the root
        self._program: list[tuple[int, int, Any, Any]] | None = None
        self._leaves: tuple[int, ...] = ()
        self.checks = 0  # full get_at resolutions: the first read and every change

    def read(self) -> list[Any]:
        """The value at every site, in ``sites`` order."""
        program = self._program
        if program is None:
            return self._check()
        objs = [self.root]
        try:
            for parent, op, arg, recorded in program:
                cur = objs[parent]
                if op == _ATTR:
                    value = getattr(cur, arg)
                elif op == _ITEM:
                    value = cur[arg]
                else:
                    value = cur[id(objs[arg])]
                if value is not recorded and recorded is not _LEAF:
                    return self._check()  # the tree changed here: check it again
                objs.append(value)
        except Exception:  # a step that no longer resolves: get_at says why
            return self._check()
        return [objs[i] for i in self._leaves]

    def _check(self) -> list[Any]:
        """Every site through ``get_at`` (the rules, SiteError as it raises it), then
        the chains of objects recorded for the next reads."""
        self._program = None
        values = [get_at(self.root, steps) for steps in self.sites]
        self.checks += 1
        self._compile()
        return values

    def _compile(self) -> None:
        objs: list[Any] = [self.root]
        nodes: dict[tuple, int] = {}
        program: list[list[Any]] = []
        inner: set[int] = set()  # nodes another step passes through

        def step(parent: int, kind: str, value: Any) -> int:
            if kind == "identity":
                module = walk(value)
                inner.add(module)
                op, arg, obj = _IDENTITY, module, objs[parent][id(objs[module])]
            elif kind == "attr":
                op, arg, obj = _ATTR, value, getattr(objs[parent], value)
            else:
                op, arg, obj = _ITEM, value, objs[parent][value]
            inner.add(parent)
            key = (parent, op, arg)
            if key not in nodes:
                nodes[key] = len(objs)
                objs.append(obj)
                program.append([parent, op, arg, obj])
            return nodes[key]

        def walk(steps: tuple[Step, ...]) -> int:
            node = 0
            for kind, value in steps:
                node = step(node, kind, value)
            return node

        leaves = tuple(walk(steps) for steps in self.sites)
        for i, ins in enumerate(program):
            if i + 1 not in inner:
                ins[3] = _LEAF
        self._program = [tuple(ins) for ins in program]  # type: ignore[misc]
        self._leaves = leaves
