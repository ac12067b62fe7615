"""Diagnostics of compiled models: attention metrics (ALS, non-locality, cross-layer similarity, gating;
:mod:`~archspec.diagnostics.metrics`), the ``archspec inspect`` report and plots
(:mod:`~archspec.diagnostics.inspection`) and forward timing (:mod:`~archspec.diagnostics.timing`)."""
