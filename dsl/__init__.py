"""duplexcadence.dsl — the `.clock` language: grammar, IR, parser, printer, diagnostics.

The bottom layer: it imports nothing from `compiler` (a test keeps it so), and the
compiler builds on it.

  codes          the registry of diagnostic codes (imports nothing)
  diagnostics    Diagnostic, Span, rendering (imports only codes)
  ir             the syntax tree the parser builds (frozen pydantic, with spans)
  mistakes       common syntax mistakes, by example
  syntax_errors  syntax errors and input limits as diagnostics
  parser         text -> IR
  printer        IR -> text (the parser's inverse)
"""
