"""Builders for the released third-party streaming models, seeded random weights.

Nothing here vendors third-party code: each module imports the installed package
and drives the vendor's own entry points.
"""
