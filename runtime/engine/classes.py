"""Capture class descriptions, as generated code writes them.

Contract of this layer: a ``CaptureClass`` names one catalog entry by example —
its argument structure with tensor leaves described, not given:
  * ``TensorSpec`` — a *staged* input: the engine allocates a static buffer of
    exactly this shape/stride/dtype (and alignment, via ``offset``) on the device;
    every replay copies the caller's tensor into it.
  * ``RegionView`` — an *aliased* input: the named region's own view at that
    extent (and, with ``index``, one slot of its leading axis: ``view(extent)[index]``).
    No staging buffer and no copy; admission pins its pointer instead, so classes
    of one shape that read different slots are told apart by that pointer.
  * plain Python scalars / dtypes / enums — keyed by value in the signature.
``materialize`` turns a description into real arguments; the class's signature is
then computed from those arguments with the same ``signature_of`` that runs on
live calls, so generated code and live traffic can never disagree on the key.

Generated code writes a callable's catalog as a ``CatalogDecl``: the argument
structure once, a leaf that differs between classes as ``OneOf(...)`` its distinct
values, and one row per class (its name and the index it picks in each ``OneOf``).
``CatalogDecl`` is the sequence of the ``CaptureClass`` objects it expands to.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping, Sequence

import torch

from .outputs import tree_leaves
from ..state.regions import Region


@dataclass(frozen=True)
class TensorSpec:
    shape: tuple[int, ...]
    dtype: torch.dtype
    fill: str | int | float = "zeros"  # "zeros" | "randn" | a constant
    stride: tuple[int, ...] | None = None  # None: contiguous
    offset: int = 0  # elements into a backing buffer; reproduces a view's alignment

    def _layout(self) -> tuple[tuple[int, ...], tuple[int, ...], int]:
        shape = tuple(int(d) for d in self.shape)
        stride = self.stride
        if stride is None:
            stride = torch.empty(shape, device="meta").stride()
        span = 0 if 0 in shape else 1 + sum((d - 1) * s for d, s in zip(shape, stride))
        return shape, tuple(stride), span

    def nbytes(self) -> int:
        """Bytes of the backing buffer: the span the strides reach, plus the offset."""
        _, _, span = self._layout()
        return (self.offset + span) * torch.empty((), dtype=self.dtype).element_size()

    def materialize(self, device: torch.device, generator: torch.Generator | None) -> torch.Tensor:
        shape, stride, span = self._layout()
        base = torch.empty(self.offset + span, dtype=self.dtype, device=device)
        if self.fill == "zeros":
            base.zero_()
        elif self.fill == "randn":
            if not self.dtype.is_floating_point:
                raise ValueError(f"fill='randn' needs a floating dtype, got {self.dtype}")
            base.normal_(generator=generator)
        elif isinstance(self.fill, (int, float)) and not isinstance(self.fill, bool):
            base.fill_(self.fill)
        else:
            raise ValueError(f"unknown fill {self.fill!r}")
        return base.as_strided(shape, stride, self.offset)


@dataclass(frozen=True)
class RegionView:
    region: str
    extent: int | None = None  # None: the whole region (no clock axis)
    index: int | None = None  # a slot of the leading axis (`region r[i]`); None: all of it


@dataclass(frozen=True)
class CaptureClass:
    name: str
    args: tuple = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)

    @property
    def extents(self) -> dict[str, int]:
        """The attended extent of each region this class takes as an argument."""
        out: dict[str, int] = {}

        def visit(x: Any) -> None:
            if isinstance(x, RegionView) and x.extent is not None:
                out[x.region] = x.extent
            elif type(x) in (tuple, list):
                for i in x:
                    visit(i)
            elif isinstance(x, Mapping):
                for v in x.values():
                    visit(v)

        visit((self.args, self.kwargs))
        return out


@dataclass(frozen=True, init=False)
class OneOf:
    """A leaf of a catalog's argument structure that differs between its classes: each
    class (row of a ``CatalogDecl``) picks one of ``choices`` by index. With ``pick_as=j``
    it picks, in every class, the index the ``j``-th varying leaf (in traversal order)
    picked, and the rows leave it out: leaves that move together are one column."""

    choices: tuple
    pick_as: int | None

    def __init__(self, *choices: Any, pick_as: int | None = None) -> None:
        if len(choices) < 2:
            raise ValueError("OneOf needs at least two choices (one is a plain leaf)")
        if pick_as is not None and not (type(pick_as) is int and pick_as >= 0):
            raise ValueError(f"pick_as must be a leaf's position (an int >= 0), got {pick_as!r}")
        object.__setattr__(self, "choices", choices)
        object.__setattr__(self, "pick_as", pick_as)


def RegionViews(region: str, *extents: int | range, pick_as: int | None = None) -> OneOf:
    """``OneOf(RegionView(region, e), ...)`` over the extents, in order; a ``range``
    stands for each of its extents (a catalog of 126 extents is one line)."""
    flat = [e for x in extents for e in (x if isinstance(x, range) else (x,))]
    return OneOf(*(RegionView(region, e) for e in flat), pick_as=pick_as)


class CatalogDecl(Sequence[CaptureClass]):
    """A catalog as generated code writes it, and the ``CaptureClass`` tuple it expands to.

    ``args``/``kwargs`` are the argument structure every class shares; ``rows`` maps
    each class name, in capture order, to the index it picks in each ``OneOf`` of that
    structure, in the order they appear (``args`` first, then ``kwargs``, depth first).
    """

    def __init__(
        self,
        args: tuple = (),
        kwargs: Mapping[str, Any] | None = None,
        *,
        rows: Mapping[str, tuple[int, ...]],
    ) -> None:
        kwargs = {} if kwargs is None else kwargs
        self.classes = tuple(_expand(name, picks, args, kwargs) for name, picks in rows.items())

    def __getitem__(self, i):  # type: ignore[override]
        return self.classes[i]

    def __len__(self) -> int:
        return len(self.classes)

    def __iter__(self) -> Iterator[CaptureClass]:
        return iter(self.classes)

    def __repr__(self) -> str:
        return f"CatalogDecl({len(self.classes)} classes)"


def _expand(name: str, picks: tuple[int, ...], args: tuple, kwargs: Mapping) -> CaptureClass:
    """The class `name`: the structure with its `OneOf` leaves replaced by its picks."""
    remaining = list(picks)
    picked: list[int] = []  # every varying leaf's index so far, in traversal order

    def fill(x: Any) -> Any:
        if isinstance(x, OneOf):
            if x.pick_as is not None:
                if x.pick_as >= len(picked):
                    raise ValueError(f"class {name}: pick_as={x.pick_as} before that leaf")
                i = picked[x.pick_as]
            elif not remaining:
                raise ValueError(f"class {name}: {len(picks)} picks for more leaves that vary")
            else:
                i = remaining.pop(0)
            if not (type(i) is int and 0 <= i < len(x.choices)):
                raise ValueError(f"class {name}: pick {i!r} of {len(x.choices)} choices")
            picked.append(i)
            return x.choices[i]
        if type(x) in (tuple, list):
            return type(x)(fill(i) for i in x)
        if type(x) is dict:
            return {k: fill(v) for k, v in x.items()}
        return x

    cls = CaptureClass(name, tuple(fill(a) for a in args), {k: fill(v) for k, v in kwargs.items()})
    if remaining:
        raise ValueError(f"class {name}: {len(picks)} picks for fewer leaves that vary")
    return cls


def materialize(
    cls: CaptureClass,
    regions: Mapping[str, Region],
    device: torch.device,
    generator: torch.Generator | None,
) -> tuple[tuple, dict, set[int]]:
    """Concrete (args, kwargs) for ``cls`` and the ids of the aliased leaves."""
    aliased: set[int] = set()

    def mat(x: Any) -> Any:
        if isinstance(x, TensorSpec):
            return x.materialize(device, generator)
        if isinstance(x, RegionView):
            if x.region not in regions:
                raise KeyError(f"class {cls.name}: unknown region {x.region!r}")
            r = regions[x.region]
            t = r.tensor if x.extent is None else r.view(x.extent)
            if x.index is not None:
                if not 0 <= x.index < t.shape[0]:
                    raise IndexError(
                        f"class {cls.name}: slot {x.index} of region {x.region!r} is outside "
                        f"its leading axis of {t.shape[0]}"
                    )
                t = t[x.index]
            aliased.add(id(t))
            return t
        if isinstance(x, torch.Tensor):
            raise TypeError(
                f"class {cls.name}: give a TensorSpec or RegionView, not a tensor "
                "(a concrete tensor would be captured by identity and staged by accident)"
            )
        if type(x) in (tuple, list):
            return type(x)(mat(i) for i in x)
        if type(x) is dict:
            return {k: mat(v) for k, v in x.items()}
        return x

    args = tuple(mat(a) for a in cls.args)
    kwargs = {k: mat(v) for k, v in cls.kwargs.items()}
    return args, kwargs, aliased


def staging_bytes(cls: CaptureClass) -> int:
    """Bytes of static staging this class needs (the first term of the reserve)."""
    return sum(
        x.nbytes() for x in tree_leaves((cls.args, dict(cls.kwargs))) if isinstance(x, TensorSpec)
    )
