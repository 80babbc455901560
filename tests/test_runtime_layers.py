"""The runtime's layers import one way, and no module imports itself through others.

``runtime/`` is laid out by concept (its ``__init__`` says what each folder holds):
leaf modules at the top that import nothing of the runtime (telemetry, controls,
progress, audit), then ``state`` < ``engine`` < ``serving`` < ``tools`` < ``serve``.
A module may import its own layer and the layers below, never one above, and the
imports of all modules together (deferred ones inside functions included; those under
``TYPE_CHECKING`` are annotations only) have no circle."""

from __future__ import annotations

import ast
from pathlib import Path

RUNTIME = Path(__file__).resolve().parent.parent / "runtime"
LAYERS = ("", "state", "engine", "serving", "tools", "serve")  # "" : the top-level leaves


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(RUNTIME).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _package_of(path: Path) -> list[str]:
    parts = list(path.relative_to(RUNTIME).parts[:-1])
    return parts


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            out.update(id(n) for n in ast.walk(node))
    return out


def imports_of(path: Path, modules: set[str]) -> set[str]:
    """The runtime modules ``path`` imports (resolved, dotted under runtime/)."""
    tree = ast.parse(path.read_text())
    skip = _type_checking_nodes(tree)
    package = _package_of(path)
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        targets: list[str] = []
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                stem = ".".join([*base, *(node.module.split(".") if node.module else [])])
            elif (node.module or "").startswith("duplexcadence.runtime"):
                stem = node.module[len("duplexcadence.runtime") :].lstrip(".")
            else:
                continue
            for alias in node.names:
                joined = f"{stem}.{alias.name}" if stem else alias.name
                targets.append(joined if joined in modules else stem)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("duplexcadence.runtime."):
                    targets.append(alias.name[len("duplexcadence.runtime.") :])
        for t in targets:
            while t and t not in modules:
                t = t.rpartition(".")[0]
            if t:
                found.add(t)
    return found


def _graph() -> dict[str, set[str]]:
    paths = {_module_name(p): p for p in RUNTIME.rglob("*.py")}
    modules = set(paths) - {""}
    graph = {}
    for name, path in paths.items():
        if name and not name.endswith("__init__"):
            graph[name] = {m for m in imports_of(path, modules) if m != name}
    return graph


def _layer(module: str) -> str:
    head = module.split(".")[0]
    return head if head in LAYERS[1:] else ""


def test_every_module_imports_its_own_layer_or_below() -> None:
    rank = {layer: i for i, layer in enumerate(LAYERS)}
    wrong = []
    for module, deps in _graph().items():
        for dep in deps:
            if dep in LAYERS[1:]:
                continue  # a layer's package itself: its __init__ holds no code
            if rank[_layer(dep)] > rank[_layer(module)]:
                wrong.append(f"{module} -> {dep}")
            if _layer(module) == "" and dep != module:
                wrong.append(f"{module} (a leaf) -> {dep}")
    assert not wrong, wrong


def test_runtime_imports_have_no_circle() -> None:
    graph = _graph()
    state: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for d in sorted(graph.get(m, ())):
            if state.get(d) == 1:
                circles.append(stack[stack.index(d) :] + [d])
            elif d not in state:
                visit(d)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)
    assert not circles, circles


def test_the_checker_sees_deferred_imports_and_layers(tmp_path: Path) -> None:
    # the check itself: a deferred import is found, a TYPE_CHECKING one is not
    f = RUNTIME / "engine" / "replay.py"
    modules = set(_graph()) | {"engine", "state", "serving", "tools", "serve"}
    deps = imports_of(f, modules)
    assert "state.regions" in deps and "telemetry" in deps
    assert _layer("serving.lane") == "serving" and _layer("telemetry") == ""


def test_no_runtime_file_or_class_is_too_long_to_hold_in_mind() -> None:
    # the re-layout's limits (issue 27): a file over 400 lines or a class over 250 is
    # split by concern (as replay.py into replay_capture/replay_telemetry) before it lands
    long_files, long_classes = [], []
    for path in RUNTIME.rglob("*.py"):
        text = path.read_text()
        if text.count("\n") > 400:
            long_files.append(f"{path.relative_to(RUNTIME)}: {text.count(chr(10))} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef) and node.end_lineno - node.lineno + 1 > 250:
                long_classes.append(f"{node.name}: {node.end_lineno - node.lineno + 1} lines")
    assert not long_files and not long_classes, (long_files, long_classes)
