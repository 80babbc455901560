"""Load a generated adapter package: from a contract, a package folder or a module name.

Contract of this layer: tools that run a contract against a model (`clockc verify`,
the fuzzer's bind property) need the generated package as an imported module
without writing into the project. ``import_generated(files)`` imports the text of a
package ``compile_source`` produced from a fresh temporary folder under a fresh
module name (so two versions of one contract never share ``sys.modules``), and the
folder lives as long as the module: ``forget(module)`` removes it, and so does the
interpreter's exit (the files stay readable for tracebacks while the module is used);
``load_adapter(target)`` takes what a user names on the command line: a ``.clock``
file (compiled here), a folder holding a generated package, or an importable
package name (``myapp.adapters.tiny``).
"""

from __future__ import annotations

import importlib
import importlib.util
import itertools
import sys
import tempfile
from pathlib import Path
from types import ModuleType

from duplexcadence.compiler.driver import Result, read_and_compile

_COUNTER = itertools.count()
_TEMPORARY_HOMES: dict[str, tempfile.TemporaryDirectory] = {}  # module name -> its folder


class LoadError(Exception):
    """The target names no adapter package (the message says why)."""


def import_generated(files: dict[str, str], prefix: str = "clockc_pkg") -> ModuleType:
    """Import a generated package's files from a temporary folder under a fresh name."""
    name = f"{prefix}_{next(_COUNTER)}"
    # TemporaryDirectory's finalizer removes the folder at exit if forget() never runs
    home = tempfile.TemporaryDirectory(prefix="clockc_")
    folder = Path(home.name) / name
    folder.mkdir()
    for file_name, source in files.items():
        (folder / file_name).write_text(source)
    try:
        module = _import_folder(folder, name)
    except BaseException:
        home.cleanup()
        raise
    _TEMPORARY_HOMES[name] = home
    return module


def forget(module: ModuleType) -> None:
    """Drop an imported package and its submodules from ``sys.modules``, and its
    temporary folder where ``import_generated`` made one."""
    name = module.__name__
    for key in [k for k in sys.modules if k == name or k.startswith(name + ".")]:
        del sys.modules[key]
    home = _TEMPORARY_HOMES.pop(name, None)
    if home is not None:
        home.cleanup()


def _import_folder(folder: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        name, folder / "__init__.py", submodule_search_locations=[str(folder)]
    )
    if spec is None or spec.loader is None:
        raise LoadError(f"{folder}: not a package")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        forget(module)
        raise
    return module


def load_adapter(target: str) -> tuple[ModuleType | None, Result | None]:
    """(the adapter package, the compile result where ``target`` is a contract).

    A ``.clock`` file with errors gives (None, result): the caller prints its
    diagnostics. A package must define ``bind``."""
    path = Path(target)
    if target.endswith(".clock"):
        result = read_and_compile(path, emit=True)
        if not result.ok:
            return None, result
        return import_generated(result.files, prefix=f"clockc_{result.contract.name}"), result
    if path.is_dir():
        if not (path / "__init__.py").is_file():
            raise LoadError(f"{target}: a folder without __init__.py is no adapter package")
        module = _import_folder(path, f"clockc_{path.name}_{next(_COUNTER)}")
    else:
        try:
            module = importlib.import_module(target)
        except ImportError as exc:
            raise LoadError(f"{target}: not a .clock file, a package folder or a module ({exc})")
    if not callable(getattr(module, "bind", None)):
        raise LoadError(f"{target}: has no bind(); name a generated adapter package")
    return module, None
