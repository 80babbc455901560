"""Jinja templates for generated adapter packages (package data)."""
