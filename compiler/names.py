"""Which contract names may reach generated Python (CLK017).

Region, callable and constant names become identifiers of the generated adapter
(locals of `bind()`, nested functions, derived names such as `<callable>_body`),
and the contract name becomes a package. A name that is a Python keyword, or
shadows anything the generated module defines or uses (builtins included), or would shadow a
standard-library or runtime package is refused here, at `clockc check`, with a
position, instead of breaking `bind()` or routing a call wrongly at run time.

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
        "CONTRACT",
        "TARGET",
        "SOURCE_SHA256",
        "DETERMINISM",
        "REGIONS",
        "RETENTIONS",
        "REGION_SITES",
        "CALLABLE_SITES",
        "CONSTANT_SITES",
        # what it imports from the runtime
        "Binding",
        "CaptureClass",
        "CarryRegion",
        "Effect",
        "ExactShapeReplay",
        "HeadTail",
        "HostCounter",
        "Region",
        "RegionSpec",
        "RegionView",
        "Ring",
        "TensorSpec",
        "Window",
        "adopt_prefix",
        "apply_settings",
        "get_at",
        "has_site",
        "infer_device",
        "install_region",
        "pin_at",
        "replace_at",
        "require_sites",
        "set_at",
        "update_at",
        # parameters and locals of bind() and of the wrappers it defines
        "model",
        "device",
        "audit",
        "capture",
        "progress",
        "binding",
        "args",
        "kwargs",
        "result",
        "value",
        "t",
        # builtins it calls
        "isinstance",
        "list",
    }
)
# Prefixes and suffixes of the names the templates derive from contract names.
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
