"""Common syntax mistakes, recognised by example (lark's `match_examples`).

Each entry is (code, hint, malformed examples). The parser recognises a syntax error
as one of these when it fails in the same parser state *and* on the same kind of
token as one of the examples, and then reports the entry's code and hint instead of
the generic "unexpected X; expected ...". Everything else stays generic, so an
example can never mislabel an unrelated error. A test keeps every example malformed
and every code registered.
"""

from __future__ import annotations

_HEAD = "contract c\n"


def _in_block(kind: str, lines: list[str]) -> list[str]:
    return [f"{_HEAD}{kind} b {{\n  {line}\n}}\n" for line in lines]


_REGION_KEYWORDS = [
    "dtype",
    "dims",
    "clock",
    "lifetime",
    "mutability",
    "retention",
    "envelope",
    "speculative",
    "stock",
    "address",
    "allocate",
    "site",
    "slot",
    "note",
]
_CALLABLE_KEYWORDS = ["site", "per", "aliased", "writes", "effects", "mode", "batch", "note"]
_CONSTANT_KEYWORDS = ["site", "dtype", "dims", "install", "note"]
_FOLD_KEYWORDS = ["site", "by", "note"]

MISTAKES: list[tuple[str, str, list[str]]] = [
    (
        "CLK020",
        "a retention keeps a positive extent, e.g. `retention window(16 frame)`; a "
        "negative size retains nothing",
        _in_block(
            "region",
            [
                "retention window(-16 frame)",
                "retention ring(-2)",
                "retention head(-1) ++ tail(3)",
                "retention head(1) ++ tail(-3)",
            ],
        ),
    ),
    (
        "CLK060",
        "an argument is written `arg NAME: TYPE`, e.g. `kwarg x: float32 [1, 4]`",
        _in_block(
            "callable",
            [
                "arg x float32 [1]",
                "kwarg x float32 [1]",
                "arg x bool",
                "kwarg x bool",
                "arg x region r",
                "kwarg x region r",
                "arg x = float32 [1]",
                "kwarg x = float32 [1]",
                'kwarg cache["a"] float32 [1]',
                'kwarg cache["a"] region r',
            ],
        ),
    ),
    (
        "CLK061",
        "block properties are written without '=' or ':', e.g. `dtype float32`",
        [
            text
            for kind, keywords in (
                ("region", _REGION_KEYWORDS),
                ("callable", _CALLABLE_KEYWORDS),
                ("constant", _CONSTANT_KEYWORDS),
                ("fold", _FOLD_KEYWORDS),
            )
            for kw in keywords
            for text in _in_block(kind, [f"{kw} = x", f"{kw}: x"])
        ]
        + [f'{_HEAD}target = "x"\n', f'{_HEAD}target: "x"\n', f"{_HEAD}catalog budget = 4\n"],
    ),
    (
        "CLK062",
        "a shape is a bracketed list, e.g. `dims [2, frame, 16]`",
        _in_block("region", ["dims 2, 3", "dims frame", "dims (2, 3)", "stock 2, 3"])
        + _in_block("constant", ["dims 16"])
        + _in_block(
            "callable",
            ["arg x: float32 1, 4", "arg x: float32 n", "arg x: float32 (1, 4)"],
        )
        + _in_block("callable", ["arg x: float32 [1, 4] strides 4, 1"]),
    ),
    (
        "CLK063",
        "a head/tail retention is written `head(P) ++ tail(R)`",
        _in_block("region", ["retention head(1) tail(2)", "retention head(1) + tail(2)"]),
    ),
    (
        "CLK064",
        "a configuration is written `config NAME in {v1, v2}` or `config (a, b) in {(1, 2)}`",
        _in_block(
            "callable",
            [
                "config x = {1}",
                "config x {1}",
                "config x in 1, 2",
                "config x in [1, 2]",
                "config x in (1, 2)",
                "config (a, b) = {(1, 2)}",
                "config (a, b) in (1, 2)",
            ],
        ),
    ),
    (
        "CLK065",
        "a derived clock is written `clock NAME = RATE per PARENT`",
        [
            f"{_HEAD}clock frame = 2 * token\n",
            f"{_HEAD}clock frame = 2 token\n",
        ],
    ),
    (
        "CLK066",
        'a site is a path, not a string, e.g. `site flow.decoder["key"]`',
        _in_block("region", ['site "x"'])
        + _in_block("callable", ['site "x"', 'retains r from "x"', 'counter "x" advances 1 from 1'])
        + _in_block("constant", ['site "x"'])
        + _in_block("fold", ['site "x"']),
    ),
    (
        "CLK067",
        "retention sizes are parenthesised, e.g. `ring(3000 frame)` or `head(P) ++ tail(R)`",
        _in_block(
            "region",
            [
                "retention ring 3",
                "retention ring x",
                "retention window 3",
                "retention window x",
                "retention head 3",
                "retention head x",
            ],
        ),
    ),
    (
        "CLK068",
        "a lockstep batch is written `batch widths {8, 16} axis 0 rows {aten.mean.dim}` "
        "(braced lists; `axis` and `rows` optional)",
        _in_block(
            "callable",
            [
                "batch 8",
                "batch {8}",
                "batch widths 8",
                "batch widths [8]",
                "batch widths (8)",
                "batch widths {8} rows aten.mean.dim",
                "batch widths {8} axis 0 rows aten.mean.dim",
                "batch widths {8} rows [aten.mean.dim]",
            ],
        ),
    ),
]
