"""duplexcadence.dsl — the `.clock` language: grammar, IR, parser, printer, diagnostics.

The bottom layer: it imports nothing from `compiler` (a test keeps it so), and the
compiler builds on it. `codes` (the diagnostic-code registry) and `diagnostics`
import nothing else; `ir` holds the syntax tree the parser builds and the printer
prints back (its inverse).
"""
