"""archspec's version: one literal, read by setuptools at build time and by the package at run time."""

__version__ = "0.1.0"
