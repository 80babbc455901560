"""Which contract names may reach generated Python (CLK017).

Generated code is data (runtime/serving/declared.py): region, callable, constant and fold names reach
it only as string keys, never as identifiers, so no contract name can shadow anything
there. Names that *are* the generated module's own identifiers, and Python keywords,
are still refused, so that a contract's tables never read like the code around them;
and the contract name becomes a package, so it must not be a keyword or shadow a
standard-library or runtime package.

`GENERATED_NAMES` is every identifier the templates write; a test parses the
generated packages and keeps this set complete.
"""

from __future__ import annotations

import keyword
import sys

from duplexcadence.dsl import ir
from duplexcadence.dsl.diagnostics import Diagnostic, error

GENERATED_NAMES = frozenset(
    {
        # module level of the generated package
        "torch",
        "bind",
        "CATALOG",
        "CALLABLES",
        "CONSTANTS",
        "CHANNELS",
        "CONTRACT",
        "DECLARED",
        "DETERMINISM",
        "FOLDS",
        "PARAMS",
        "REGIONS",
        "SOURCE_SHA256",
        "TARGET",
        "__all__",
        # what it imports from the runtime
        "Advance",
        "Aliased",
        "Autocast",
        "BatchDecl",
        "CallableDecl",
        "CaptureClass",
        "ChannelDecl",
        "CatalogDecl",
        "ConstantDecl",
        "ContractDecl",
        "Counter",
        "Effect",
        "FoldDecl",
        "Guard",
        "HeadTail",
        "OneOf",
        "RegionViews",
        "range",
        "ParamDecl",
        "RegionDecl",
        "RegionSpec",
        "RegionTable",
        "RegionView",
        "Retains",
        "StateObject",
        "Ring",
        "TensorSpec",
        "Tracks",
        "Window",
        "bind_contract",
        # parameters of bind()
        "model",
        "device",
        "audit",
        "capture",
        "progress",
        "backend",
        "params",
        "ambient",
        "batch",
        "proof",
    }
)
# Prefixes and suffixes of names generated code once derived from contract names; no
# longer written, still refused, so old and new generated packages read alike.
DERIVED_PREFIXES = ("_", "stock_")
DERIVED_SUFFIXES = ("_body", "_engine")
# Package names a generated package must never shadow where its folder is importable.
RUNTIME_PACKAGES = frozenset({"torch", "duplexcadence", "generated", "contracts"})


def _is_keyword(name: str) -> bool:
    return keyword.iskeyword(name) or keyword.issoftkeyword(name)


def identifier_problem(name: str) -> str | None:
    """Why `name` cannot be an identifier of the generated adapter, or None."""
    if _is_keyword(name):
        return "is a Python keyword"
    if name in GENERATED_NAMES:
        return "is reserved in the generated adapter"
    if name.startswith(DERIVED_PREFIXES) or name.endswith(DERIVED_SUFFIXES):
        return (
            "is reserved in the generated adapter, for the names it derives "
            f"(prefixes {', '.join(DERIVED_PREFIXES)}; suffixes {', '.join(DERIVED_SUFFIXES)})"
        )
    return None


def package_problem(name: str) -> str | None:
    """Why `name` cannot be the generated package's name, or None."""
    if _is_keyword(name):
        return "is a Python keyword"
    if name.startswith("__"):
        return "is a dunder name"
    if name in sys.stdlib_module_names or name in RUNTIME_PACKAGES:
        return "would shadow a standard-library or runtime package of the same name"
    return None


def check_names(contract: ir.Contract) -> list[Diagnostic]:
    found = []
    for kind, nodes in (
        ("region", contract.regions),
        ("callable", contract.callables),
        ("constant", contract.constants),
        ("fold", contract.folds),
        ("channel", contract.channels),
    ):
        for node in nodes:
            problem = identifier_problem(node.name)
            if problem:
                found.append(
                    error(
                        "CLK017",
                        f"'{node.name}' {problem}; choose another name",
                        node.span,
                    )
                )
    problem = package_problem(contract.name)
    if problem:
        found.append(
            error(
                "CLK017",
                f"contract name '{contract.name}' {problem}; it becomes the generated "
                "package's name",
                contract.span,
            )
        )
    return found
