"""Emit: render the lowered contract into black-formatted Python files.

Jinja runs with StrictUndefined and one filter table; output is formatted
in-process by the pinned black with a fixed mode, so it is byte-identical on
every run and every machine. No timestamps, no absolute paths.
"""

from __future__ import annotations

import functools

import black
import jinja2

from duplexcadence.compiler.lowered import LoweredContract

TEMPLATES = {
    "__init__.py": "__init__.py.jinja",
    "contract.py": "contract.py.jinja",
    "adapter.py": "adapter.py.jinja",
}
BLACK_MODE = black.Mode(line_length=100, target_versions={black.TargetVersion.PY310})

FILTERS = {"pyrepr": repr}


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
