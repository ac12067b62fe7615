"""The shared Optuna engine of every search mode (private: import the public names from archspec.search)."""
