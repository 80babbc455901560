"""duplexcadence.compiler — validation, analysis, lowering and emit of `.clock` contracts.

Layers, data flowing one way (each imports only the ones above it, and `dsl`):

  evaluate        expressions to (value, unit), bounded
  names, sites    which names and sites may reach generated code
  region_rules,
  callable_rules  validation rules (mixins of validate)
  validate        IR -> Checked + diagnostics
  extents         attended extents in closed form, joint extents by lifetime
  analysis        Checked -> Analysis (catalogs, memory plan) + diagnostics
  lowered         the typed template context (frozen dataclasses of plain values)
  lower, emit     Analysis -> template context -> black-formatted files
  report          tables and JSON of an analysis
  driver, cli     reading files, the pipeline, `clockc`

`__version__` is the version the generated header records (pyproject.toml's, kept
equal by a test): never read from install metadata, so output does not depend on
what is installed.
"""

__version__ = "0.1.0"
