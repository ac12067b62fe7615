"""Tabulated spaces: archspec table and the --oracle (private: import the public names from archspec.search)."""
