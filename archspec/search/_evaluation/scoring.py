"""What ranks a trained proxy (torch-free: the command line's choices come from here).

* ``accuracy`` (the default, :class:`~archspec.search._evaluation.protocols.ProxyProtocol`): its val top-1 at the
  last step (0..1).
* ``tse``: minus its mean training loss over the run -- the sum of training losses (TSE; Ru et al. 2021, "Speedy
  Performance Estimation for Neural Architecture Search") divided by the steps, so that at one step count the
  ranking is TSE's.  On levit_small's table TSE ranks single designs better than the same run's val top-1, but
  fronts chosen by it are smaller (it leans to large models): docs/search-works.md, "The proxy score".
"""

from __future__ import annotations

__all__ = ["PROXY_SCORES", "proxy_score", "objective_name"]

PROXY_SCORES = ("accuracy", "tse")
# The study's name for its first objective (optuna-dashboard's axes and tables): what the value is.  The proxy's
# val top-1 stays a trial user attribute ("accuracy") either way.
_OBJECTIVE_NAMES = {"accuracy": "accuracy", "tse": "score (-mean train loss)"}


def proxy_score(kind: str, accuracy: float, loss_sum: float, steps: int) -> float:
    """The value that ranks a candidate (higher is better): ``accuracy`` for ``kind == "accuracy"``, else
    ``-loss_sum / steps``.

    Raises:
        ValueError: ``kind`` is not one of :data:`PROXY_SCORES`.
    """
    if kind == "accuracy":
        return float(accuracy)
    if kind == "tse":
        return -float(loss_sum) / max(int(steps), 1)
    raise ValueError(f"unknown proxy score {kind!r}: one of {', '.join(PROXY_SCORES)}")


def objective_name(kind: str) -> str:
    """The study's name for the objective a proxy score ``kind`` gives: ``"accuracy"`` (val top-1, 0..1) or
    ``"score (-mean train loss)"`` (``tse``: ``-TSE / steps``, nats per step, higher is better).

    Raises:
        ValueError: ``kind`` is not one of :data:`PROXY_SCORES`.
    """
    if kind not in _OBJECTIVE_NAMES:
        raise ValueError(f"unknown proxy score {kind!r}: one of {', '.join(PROXY_SCORES)}")
    return _OBJECTIVE_NAMES[kind]
