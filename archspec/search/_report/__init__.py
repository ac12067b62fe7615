"""What a search writes and prints (private: import the public names from archspec.search)."""
