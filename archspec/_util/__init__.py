"""Plumbing every layer may use: lazy exports, the strict pydantic base, byte and number units.

Nothing here knows about specs, graphs or models (the bottom layer of the import-linter contract in
``pyproject.toml``).
"""
