"""The search modes and their contract (private: import the public names from archspec.search)."""
