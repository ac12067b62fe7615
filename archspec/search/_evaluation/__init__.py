"""What a candidate is measured by: budgets, proxy training, latency, zero-cost scores (private: import the public
names from archspec.search)."""
