"""The defaults of a search run, and the names the command line offers (stdlib only: no spec parser, no Optuna,
no torch), so ``archspec search --help`` prints them without importing anything heavy.

:mod:`archspec.search._engine.config` re-exports every name; the command line reads them from its face,
:mod:`archspec.search.cli_support`.
"""

from __future__ import annotations

__all__ = [
    "FIDELITIES", "ZERO_COST_RANKINGS", "DEFAULT_FIDELITY", "DEFAULT_TRIALS", "DEFAULT_TIMEOUT_S",
    "DEFAULT_TRIAL_TIMEOUT_S", "BUDGET_OPTIONS", "ZERO_COST_ATTR", "MASKS_PROXY_DEFAULTS",
    "MASKS_TRIAL_TIMEOUT_S", "SAMPLERS", "DEFAULT_SAMPLER", "DEFAULT_SAMPLER_STARTUP", "DEFAULT_VERIFY",
]

DEFAULT_TRIALS = 16          # trained candidates of the bare `archspec search --budget-flops 1G`
DEFAULT_TIMEOUT_S = 540.0    # ... or this many seconds of search, whichever comes first (2 CPU cores: < 10 min)
DEFAULT_TRIAL_TIMEOUT_S = 150.0  # one candidate's proxy training may take at most this long
# --verify: the front's best designs trained again with a second seed, inside the budget
# (archspec.search._engine.verify).
# Three is the fewest whose rank agreement is more than a coin flip (tau over 3 pairs); on levit_small two seeds of
# one design differ by as much as a front's designs do (docs/search-works.md), so the front says how sure it is.
DEFAULT_VERIFY = 3

# Mask placement trains the given spec, typically a deep DeiT-style model (class token, LayerNorm,
# 12-24 blocks).  Those do not learn at the design proxy's lr 2e-3 in 150 steps: MaiT-T Sch.1 stayed
# at chance (0.12 val top-1, digits at 64 px), while lr 3e-4 for 400 steps reached 0.41 (measured here).
# Mask placement needs a token grid where a 3x3 window is local: at least 7x7 (MaiT works on 14x14;
# on 4x4 a 3x3 window covers most of the image and masked heads attend almost uniformly), reached by a
# smaller patch or fewer stride-2 stem convs -- see proxy_spec.  min_grid 8 gives 64 px, patch 8 -> 8x8 for
# a patch-16 spec at 224 px (the grid docs/search.md measured mask placement at); `--proxy-min-grid real`
# trains at the spec's own 14x14 grid instead (56 px, patch 4), about 3x the tokens.
#
# lr 1e-3 (not 3e-4) so that the first round's attention becomes local at all (issue 37; bench/mask_locality.py,
# docs/search.md "The default"; 2 cores, one torch thread on core 0 while core 1 was busy).  Normalised ALS of
# the masked head 0 of MaiT-T after round 1, mean over layers 0-7 / 16-23, and the round's wall time:
#   digits,        lr 3e-4, 400 steps: 0.00-0.09 in every layer (issue 37): MaiT's rule removes every mask;
#   digits,        lr 1e-3, 400 steps: early 0.235, late 0.064 (4 layers keep head 0, 3 of them early), 650 s;
#   Fashion-MNIST, lr 3e-4, 400 steps: 0.02 / 0.02 (no locality), 680 s;
#   Fashion-MNIST, lr 1e-3, 600 steps: 0.29 / 0.19 (14 layers keep head 0), 1,105 s.
# The learning rate, not the data, lets locality emerge in a few hundred steps; digits at 1e-3 gives the
# clearest early/late contrast per CPU second and needs no installed dataset.
# Its rounds report the val top-1 (the ALS rule, not a ranking, chooses the placement): score "accuracy".
MASKS_PROXY_DEFAULTS = {"lr": 1e-3, "steps": 400, "batch_size": 32, "warmup_steps": 40, "eval_every": 100,
                        "min_grid": 8, "score": "accuracy"}
MASKS_TRIAL_TIMEOUT_S = 1800.0  # a 400-step round of MaiT-T took 650 s on one thread; 900 s left little margin

# Multi-fidelity kinds (archspec.search._engine.fidelity), and what the zero-cost rung (fidelity "zc") can rank by:
# archspec.search._evaluation.zero_cost's scores, and the #params / #MACs baselines (at the spec's own size) that
# published studies find hard to beat on transformers.  Here, not in fidelity.py, so the parser needs no Optuna.
FIDELITIES = ("none", "zc", "sha", "hyperband")
ZERO_COST_RANKINGS = ("synflow", "naswot", "grad_norm", "params", "macs")
# The default is no rung: a rung whose score ranks at chance is no default.  On the default space (12 designs,
# all of Fashion-MNIST, real token geometry) SynFlow ranks at tau -0.03, NASWOT -0.12, grad-norm 0.00, #MACs 0.09;
# on levit_small's table (51 designs) every zero-cost score ranks below a short run's TSE and SynFlow (0.40)
# below #MACs (0.45), and searches with the SynFlow rung ended with smaller fronts than without it at the same
# simulated CPU budget (research/search-works-history.md).  --fidelity zc keeps the rung for those who want the time
# it saves.
DEFAULT_FIDELITY = "none"

SAMPLERS = ("tpe", "nsga2", "gp", "random", "front", "strata")  # archspec.search._engine.study.make_sampler builds each
# Random sampling: on levit_small's complete table (224 designs), 200 paired oracle searches of 20 candidates with
# fronts scored on the seeds that did not answer them, no sampler tried (strata, TPE, local search around the front)
# beat it at equal CPU under the rule fixed before the table was read (docs/search-works.md, "Today's results").
# With 20 candidates multivariate TPE fills its "good" half with the cheapest designs
# (research/search-works-notebook.md, "On 90 designs").  --sampler tpe remains.
DEFAULT_SAMPLER = "random"
DEFAULT_SAMPLER_STARTUP = 6  # random trials before TPE's or the GP's model (Optuna's n_startup_trials)

# Trial user attribute: the zero-cost scores of the candidate (the proxy's geometry:
# archspec.search._evaluation.protocols.GEOMETRY_ATTR).
ZERO_COST_ATTR = "zero_cost"

# The command-line option of each budget field: the library's errors name the field (budgets.macs), and
# archspec.cli.search names the option instead (archspec.errors.SpecError.with_options).
BUDGET_OPTIONS = {"macs": "--budget-flops", "params": "--budget-params", "latency_ms": "--budget-latency",
                  "memory": "--max-memory"}
