"""The command line: one module per group of subcommands (:mod:`~archspec.cli.app` holds the parser and the
spec commands ``validate``, ``build``, ``inspect``, ``list``, ``schema``).  It depends on everything and nothing
imports it.  ``validate``, ``list``, ``schema`` and ``--help`` never import torch."""

from archspec.cli.app import entry, main

__all__ = ["entry", "main"]
