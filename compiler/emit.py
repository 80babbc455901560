"""Emit: render the lowered contract into black-formatted Python files.

Jinja runs with StrictUndefined and one filter table; output is formatted
in-process by the pinned black with a fixed mode, so it is byte-identical on
every run and every machine. No timestamps, no absolute paths.
"""

from __future__ import annotations

import functools

import black
import jinja2

from duplexcadence.compiler.lower import extent_runs
from duplexcadence.compiler.lowered import LoweredContract

TEMPLATES = {
    "__init__.py": "__init__.py.jinja",
    "contract.py": "contract.py.jinja",
    "adapter.py": "adapter.py.jinja",
}
BLACK_MODE = black.Mode(line_length=100, target_versions={black.TargetVersion.PY310})


def _literal(value: object) -> str:
    """``repr``, with str literals as black writes them (double quotes, unless the text
    has one): the region and catalog tables are written under `# fmt: off`, one row per
    line, and must read like the black-formatted rest."""
    if isinstance(value, str):
        text = repr(value)
        return '"' + text[1:-1] + '"' if text.startswith("'") and '"' not in value else text
    if type(value) in (tuple, list):
        items = ", ".join(_literal(v) for v in value)  # type: ignore[union-attr]
        if type(value) is list:
            return f"[{items}]"
        return f"({items},)" if len(value) == 1 else f"({items})"  # type: ignore[arg-type]
    return repr(value)


def _extents(extents: tuple) -> str:
    """A region's attended extents as the comment shows them: `0, 2, ..., 248, 249`."""
    out = []
    for run in extent_runs(list(extents)):
        if isinstance(run, tuple) and len(range(*run)) > 4:
            start, stop, step = run
            out.append(f"{start}, {start + step}, ..., {stop - step}")
        elif isinstance(run, tuple):
            out += [str(e) for e in range(*run)]
        else:
            out.append(str(run))
    return "[" + ", ".join(out) + "]"


FILTERS = {"pyrepr": _literal, "extents": _extents}


@functools.lru_cache(maxsize=1)  # templates compile once per process, not once per contract
def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("duplexcadence.templates", "."),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )
    env.filters.update(FILTERS)
    return env


def render_package(lowered: LoweredContract) -> dict[str, str]:
    """Return {file name: formatted source} for one contract's generated package."""
    env = _environment()
    files = {}
    for name, template in TEMPLATES.items():
        text = env.get_template(template).render(**lowered.context())
        files[name] = black.format_str(text, mode=BLACK_MODE)
    return files
