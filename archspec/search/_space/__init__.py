"""The search-space language (private: import the public names from archspec.search)."""
