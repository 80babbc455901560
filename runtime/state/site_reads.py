"""Compiled site reads: many sites of one root, read on every call at the cost of plain lookups.

Contract of this layer. ``SiteReads(root, sites).read()`` returns the values at
``sites`` (paths from ``root``, sites.py), in order, exactly as ``get_at`` would give
them now. ``get_at`` checks the path rules (sites.py: a path stays in the object's
own tree) at every step of every read; on a replayed call that checks every
write-through site (admission clause ii) this was most of the host time: VoxCPM2's
26 identity-keyed sites (``stream._states[id(vae.decoder.model[2].block[2].block[1])]``,
up to 12 steps each) took 1.1-1.9 ms of host time per call on a 2-core CPU.

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
stride and dtype with the captured ones). So the one rule a later read does not
re-check is the own-attribute rule of an attribute step from an unchanged object: if
the object's own attribute were deleted and its class held one of the same name,
``get_at`` would refuse the site, while a read goes on with the class's value: on an
inner step only if that is the very object recorded, and at a site's last step as the
value read, which admission then compares like any other (a different tensor misses).
"""

from __future__ import annotations

import operator
from typing import Any, Callable, Mapping

from .sites import Step, get_at


class SiteReads:
    def __init__(self, root: Any, sites: Mapping[str, tuple[Step, ...]]) -> None:
        self.root = root
        self.names = tuple(sites)
        self.sites = tuple(sites.values())
        # the objects the paths pass through, parents first: (parent node, the lookup
        # its step resolved to, the object recorded there); node 0 is the root. Then one
        # (parent node, lookup) per site: its value. An identity step's lookup is by the
        # id of the recorded module, which its own node verifies first.
        self._inner: list[tuple[int, Callable[[Any], Any], Any]] | None = None
        self._leaves: list[tuple[int, Callable[[Any], Any]]] = []
        self.checks = 0  # full get_at resolutions: the first read and every change

    def read(self) -> list[Any]:
        """The value at every site, in ``sites`` order."""
        inner = self._inner
        if inner is None:
            return self._check()
        objs = [self.root]
        try:
            for parent, lookup, recorded in inner:
                value = lookup(objs[parent])
                if value is not recorded:
                    return self._check()  # the tree changed here: check it again
                objs.append(value)
            return [lookup(objs[parent]) for parent, lookup in self._leaves]
        except Exception:  # a step that no longer resolves: get_at says why
            return self._check()

    def _check(self) -> list[Any]:
        """Every site through ``get_at`` (the rules, SiteError as it raises it), then
        the chains of objects recorded for the next reads."""
        self._inner = None
        values = [get_at(self.root, steps) for steps in self.sites]
        self.checks += 1
        self._compile()
        return values

    def _compile(self) -> None:
        objs: list[Any] = [self.root]
        nodes: dict[tuple, int] = {}  # (parent node, kind, name/key/module node) -> node
        inner: list[tuple[int, Callable[[Any], Any], Any]] = []

        def lookup(kind: str, value: Any) -> tuple[Callable[[Any], Any], Any]:
            if kind == "identity":
                module = walk(value)
                return operator.itemgetter(id(objs[module])), module
            if kind == "attr":
                return operator.attrgetter(value), value
            return operator.itemgetter(value), value

        def walk(steps: tuple[Step, ...]) -> int:
            node = 0
            for kind, value in steps:
                get, arg = lookup(kind, value)
                key = (node, kind, arg)
                if key not in nodes:
                    nodes[key] = len(objs)
                    objs.append(get(objs[node]))
                    inner.append((node, get, objs[-1]))
                node = nodes[key]
            return node

        leaves = []
        for steps in self.sites:
            parent = walk(steps[:-1])
            get, _ = lookup(*steps[-1])
            leaves.append((parent, get))
        self._inner, self._leaves = inner, leaves
