"""The measures of bench/search_works.py against hand-computed cases: 2-D hypervolume, the Pareto filter and the
anytime look-up that the search-vs-random comparison rests on."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def works(bench_module):
    return bench_module("search_works")


def test_hypervolume_2d_by_hand(works):
    ref = (1.0, 1.0)
    assert works.hypervolume_2d([], ref) == 0.0
    assert works.hypervolume_2d([(0.5, 0.5)], ref) == pytest.approx(0.25)
    # two points, a staircase: [0.2,1]x[0.6,1] U [0.5,1]x[0.3,1] = 0.8*0.4 + 0.5*0.3 = 0.47
    assert works.hypervolume_2d([(0.2, 0.6), (0.5, 0.3)], ref) == pytest.approx(0.47)
    # a dominated point and one beyond the reference add nothing
    assert works.hypervolume_2d([(0.2, 0.6), (0.5, 0.3), (0.6, 0.7), (1.2, 0.0)], ref) == pytest.approx(0.47)


def test_pareto_keeps_the_undominated(works):
    points = [(0.9, 5.0, "a"), (0.8, 2.0, "b"), (0.85, 6.0, "c"), (0.9, 5.0, "d"), (0.7, 2.0, "e")]
    assert works.pareto(points) == ["a", "b", "d"]


def test_value_at_is_the_last_entry_by_then(works):
    run = [{"seconds": 1.0, "hv_macs": 0.1}, {"seconds": 3.0, "hv_macs": 0.4}]
    assert [works.value_at(run, "hv_macs", t) for t in (0.5, 1.0, 2.9, 10.0)] == [0.0, 0.1, 0.1, 0.4]


def test_cross_seed_compares_with_the_mean_of_the_other_seeds(works):
    """Four designs, three seeds: seeds 1 and 2 rank 0.1 < 0.2 < 0.3 < 0.4; seed 0 swaps the first two.  Seed 0's
    value against mean(seeds 1, 2): 5 concordant pairs, 1 discordant -> 4/6.  Seed 1's value against mean(seeds 0,
    2) = [0.15, 0.15, 0.3, 0.4]: 5 concordant, one tie in y -> tau-b 5 / sqrt(6 * 5); seed 2 the same."""
    finals = {0: [0.2, 0.1, 0.3, 0.4], 1: [0.1, 0.2, 0.3, 0.4], 2: [0.1, 0.2, 0.3, 0.4]}
    rows = [{"key": f"d{i}", "seed": s, "final_accuracy": acc} for s, accs in finals.items()
            for i, acc in enumerate(accs)]
    assert works.common_seeds(rows) == (0, 1, 2)
    designs = works.paired_designs(rows, (0, 1, 2))
    got = works.cross_seed(designs, lambda r: r["final_accuracy"], (0, 1, 2))
    assert got["tau"] == pytest.approx((4 / 6 + 2 * 5 / 30 ** 0.5) / 3, abs=1e-9)


@pytest.mark.slow  # 1.5-3.4 s in the quick subset (docs/contributing.md: over a second is slow)
def test_the_interval_of_a_mean_over_seeds_resamples_designs_not_pooled_pairs(works):
    """Two seeds that measured exactly the same: the mean tau is one seed's tau, so its interval must be that
    seed's own design bootstrap.  Pooling both seeds' pairs into one sample of 2n would narrow it (each design
    counted twice) -- the flaw this replaced."""
    x = [0.1, 0.4, 0.2, 0.5, 0.3, 0.7, 0.6, 0.8]
    y = [0.2, 0.1, 0.4, 0.3, 0.6, 0.5, 0.8, 0.7]
    assert works.bootstrap_mean([x, x], [y, y]) == works.bootstrap(x, y)
    low, high = works.bootstrap(x, y)
    assert low < 0.4286 < high  # tau of x and y: 20 concordant, 8 discordant of 28 pairs -> 12/28


def test_hand_designs_front_by_hand(works):
    """Four designs, two of them hand designs (A: acc 0.7, 10 MACs; B: acc 0.8, 30 MACs).  Scaled to the table's
    bounds (acc 0.6..0.9, MACs 10..40), A is (1 - 0.1/0.3, 0) and B (1 - 0.2/0.3, 2/3): their front covers
    (1 - 2/3) * (1 - 1/3) ... = 1/3 * 1/3 (B's strip) + 1/3 * 1 (A's strip) = 4/9; under 25 MACs only A (0.7)."""
    from archspec.search._tabulation.oracle import OracleTable

    designs = {"A": (0.7, 10, 1.0, "LeViT-like"), "B": (0.8, 30, 3.0, "DeiT-like"), "C": (0.9, 20, 2.0, None),
               "D": (0.6, 40, 4.0, None)}
    rows = {k: {0: {"final_accuracy": acc, "macs": macs, "hand": hand}} for k, (acc, macs, _, hand) in designs.items()}
    table = OracleTable(file="t", space="s", rows=rows, latency_ms={k: v[2] for k, v in designs.items()},
                        meta={"reference_seeds": [0]})
    truth = works.Truth(table)
    assert truth.hand_designs() == {"LeViT-like": "A", "DeiT-like": "B"}
    got = works.hand_summary(truth, macs_budget=25)
    assert got["hv_macs"] == pytest.approx(4 / 9) and got["hv_latency"] == pytest.approx(4 / 9)
    assert got["best_under_budget"] == 0.7 and got["designs"]["DeiT-like"]["macs"] == 30
    assert got["best_under_budget_seeds"] == [0.7]  # A's per-seed finals, for the Welch test against a search's best


def test_below_the_hand_design_is_welchs_one_sided_test(works):
    """Means 0.775 against 0.795, each of three seeds with SD 0.005: t = -0.02 / sqrt(2 * 0.005**2 / 3) = -4.9 on
    4 degrees of freedom, p about 0.004 -- below.  The same design, or one 0.001 lower with the hand design's own
    spread (t -0.16), is not; nor is a design above the hand design."""
    hand = [0.790, 0.795, 0.800]
    assert works.below([0.770, 0.775, 0.780], hand)
    assert not works.below(hand, hand)
    assert not works.below([0.789, 0.794, 0.799], hand)
    assert not works.below([0.80, 0.81, 0.82], hand)


def test_headroom_by_hand(works):
    """Five designs (accuracy, MACs): A (0.7, 10), B (0.8, 20), C (0.9, 30), D (0.85, 25), E (0.75, 28).  Scaled to
    the table (accuracy 0.7..0.9, MACs 10..30) the front A, B, C, D dominates B's (0.5, 0.5) box, 1/4, and D's
    (0.25, 0.75) box adds 1/4 * 1/4: 5/16.  A proxy that puts B below A and E above C reports A, D, E: D's box
    alone, 3/16.  Evaluating every design, random draws of all five, and a perfect sampler given four designs all
    report that; a perfect sampler given two (A and B, the first of the front) reports A alone: 0.  Under 26 MACs
    the best is D (0.85), and the misranking proxy still picks D."""
    import numpy as np

    from archspec.search._tabulation.oracle import OracleTable

    designs = {"A": (0.7, 10), "B": (0.8, 20), "C": (0.9, 30), "D": (0.85, 25), "E": (0.75, 28)}
    rows = {k: {0: {"final_accuracy": acc, "macs": macs, "hand": None}} for k, (acc, macs) in designs.items()}
    truth = works.Truth(OracleTable(file="t", space="s", rows=rows, latency_ms={}, meta={"reference_seeds": [0]}))
    perfect = works.headroom_of(truth, [dict(truth.accuracy)], (5,), 20, 26, np.random.default_rng(0))
    assert set(perfect["planes"]) == {"macs"}  # no latency pass: no latency plane
    assert perfect["planes"]["macs"]["best"] == pytest.approx(5 / 16)
    assert perfect["planes"]["macs"]["all_designs_proxy"] == pytest.approx(5 / 16)
    proxy = {"A": 0.5, "B": 0.4, "C": 0.9, "D": 0.8, "E": 0.95}
    got = works.headroom_of(truth, [proxy], (2, 4, 5), 20, 26, np.random.default_rng(0))
    macs = got["planes"]["macs"]
    assert macs["best"] == pytest.approx(5 / 16) and macs["first"] == 4
    assert macs["all_designs_proxy"] == pytest.approx(3 / 16)
    assert macs["by_trials"][5]["random"]["median"] == pytest.approx(3 / 16)
    assert macs["by_trials"][4]["perfect_sampler"]["iqr"] == pytest.approx([3 / 16, 3 / 16])
    assert macs["by_trials"][2]["perfect_sampler"]["median"] == 0.0
    assert got["best_under_budget"]["best"] == 0.85 and got["best_under_budget"]["all_designs_proxy"] == 0.85


def test_a_live_runs_front_is_its_own_then_scored_on_the_table(bench_module, tmp_path):
    """bench/search_live.py: the front is chosen by the run's proxy (score, latency) -- here A (0.9, 1 ms) and
    C (0.95, 3 ms); B (0.8, 2 ms) is dominated, a reused copy of C adds nothing -- and then scored by the table's
    reference: A and C are the hand test's A (acc 0.7, 10 MACs) and B (acc 0.8, 30 MACs), so 4/9 as there; under
    25 MACs the best by proxy score is A (reference 0.7)."""
    import optuna

    from archspec.search._tabulation.oracle import OracleTable

    live = bench_module("search_live")
    works = live._works()
    designs = {"A": (0.7, 10, 1.0), "C": (0.8, 30, 3.0), "B": (0.9, 20, 2.0), "D": (0.6, 40, 4.0)}
    rows = {k: {0: {"final_accuracy": acc, "macs": macs}} for k, (acc, macs, _) in designs.items()}
    truth = works.Truth(OracleTable(file="t", space="s", rows=rows, latency_ms={k: v[2] for k, v in designs.items()},
                                    meta={"reference_seeds": [0]}))
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 'study.db'}", directions=["maximize", "minimize"])
    for key, score, ms, extra in (("A", 0.9, 1.0, {}), ("B", 0.8, 2.0, {}), ("C", 0.95, 3.0, {}),
                                  ("C", 0.95, 3.0, {"reused_from": 2})):
        study.add_trial(optuna.trial.create_trial(values=[score, ms],
                                                  user_attrs={"arch_key": key, "latency_ms": ms, **extra}))
    got = live.score_run(tmp_path, truth, macs_budget=25)
    assert (got["trained"], got["front"], got["front_in_table"]) == (3, 2, 2)
    assert got["hv_macs"] == pytest.approx(4 / 9) and got["hv_latency"] == pytest.approx(4 / 9)
    assert got["best_under_budget"] == 0.7


def test_a_simulation_reads_a_snapshot_of_the_table_not_the_file_being_merged(works, tmp_path):
    """simulate copies the table and its sidecars once: rows merged into the original afterwards are not seen."""
    from archspec.search._tabulation.oracle import TABLES_DIR

    src = tmp_path / "src"
    src.mkdir()
    (src / "t.jsonl").write_text('{"row": 1}\n')
    (src / "t.meta.json").write_text('{"meta": 1}')
    into = tmp_path / "frozen"
    into.mkdir()
    copy = Path(works.snapshot_table(str(src / "t.jsonl"), into))
    (src / "t.jsonl").write_text('{"row": 1}\n{"row": 2}\n')  # a merge after the snapshot
    assert copy == into / "t.jsonl" and copy.read_text() == '{"row": 1}\n'
    assert (into / "t.meta.json").read_text() == '{"meta": 1}' and not (into / "t.latency.json").exists()
    shipped = tmp_path / "shipped"
    shipped.mkdir()
    copy = Path(works.snapshot_table("levit_small", shipped))  # a shipped table by name, with both sidecars
    assert copy.read_bytes() == (TABLES_DIR / "levit_small.jsonl").read_bytes()
    assert (shipped / "levit_small.latency.json").read_bytes() == (TABLES_DIR / "levit_small.latency.json").read_bytes()


def test_the_live_proxies_rank_and_resample_by_hand(bench_module, tmp_path):
    """bench/search_live.py --proxies: designs A, B, C (reference 0.7 / 0.8 / 0.9, MACs 10 / 20 / 30, 1 / 2 / 3 ms;
    D, 0.6 at 40 MACs and 4 ms, widens the bounds and is not trained live).  Live val top-1 0.5 / 0.6 / 0.4 ranks
    them at tau (1 - 2) / 3; TSE -1.0 / -0.9 / -0.8 at tau 1.  Scaled to the bounds (0.6..0.9, 1..4 ms) A is
    (2/3, 0), B (1/3, 1/3), C (0, 2/3): TSE's front is all three, 1/9 + 2/9 + 3/9 = 2/3; val top-1 drops C (B is
    faster and scores higher), 2/9 + 3/9 = 5/9 -- the same in MACs.  The second run's copy of A's training, a
    reused trial and a design the table lacks are not counted; the table's proxies equal the live ones here."""
    import optuna

    from archspec.search._tabulation.oracle import OracleTable

    live = bench_module("search_live")
    works = live._works()
    trained = {"A": (0.7, 10, 1.0, 0.5, 120.0), "B": (0.8, 20, 2.0, 0.6, 108.0), "C": (0.9, 30, 3.0, 0.4, 96.0)}
    rows = {k: {0: {"final_accuracy": acc, "macs": macs, "n_params": macs, "curve": [[120, top1, 0.0]],
                    "tse": [[120, loss_sum, 0.0]]}} for k, (acc, macs, _, top1, loss_sum) in trained.items()}
    rows["D"] = {0: {"final_accuracy": 0.6, "macs": 40, "n_params": 40, "curve": [[120, 0.1, 0]], "tse": [[120, 1, 0]]}}
    truth = works.Truth(OracleTable(file="t", space="s", rows=rows, meta={"reference_seeds": [0]},
                                    latency_ms={"A": 1.0, "B": 2.0, "C": 3.0, "D": 4.0}))
    runs = []
    for run, keys in (("r0", ["A", "B", "C", "E"]), ("r1", ["A"])):
        study = optuna.create_study(storage=f"sqlite:///{tmp_path / run}.db", directions=["maximize", "minimize"])
        for key in keys:
            _, macs, ms, top1, loss_sum = trained.get(key, (0, 5, 0.5, 0.99, 1.0))
            attrs = {"arch_key": key, "accuracy": top1, "loss_sum": loss_sum, "steps": 120, "latency_ms": ms}
            study.add_trial(optuna.trial.create_trial(values=[top1, ms], user_attrs=attrs))
        study.add_trial(optuna.trial.create_trial(values=[0.4, 3.0], user_attrs={**attrs, "reused_from": 0}))
        (tmp_path / run).mkdir()
        (tmp_path / f"{run}.db").rename(tmp_path / run / "study.db")
        runs.append({"run_dir": str(tmp_path / run)})
    (tmp_path / "live.json").write_text(json.dumps({"results": {"m": runs}}))
    got = live.proxy_report(tmp_path / "live.json", truth, trials=(3,), draws=5)
    assert (got["trainings"], got["designs"]) == (3, 3)
    assert got["tau"]["val top-1"]["tau"] == pytest.approx(-1 / 3) and got["tau"]["TSE"]["tau"] == pytest.approx(1)
    row = got["resampled"][3]
    for source in ("live", "table"):
        for cost in ("latency", "macs"):
            assert row[f"{source} tse {cost}"] == pytest.approx(2 / 3)
            assert row[f"{source} accuracy {cost}"] == pytest.approx(5 / 9)
            assert row[f"{source} tse beats accuracy {cost}"] == 1.0


def test_a_front_is_scored_on_the_seeds_that_did_not_answer_it(works):
    """Issue 54's leak: design A's proxy was answered by table seed 0, its lucky seed (0.9; seeds 1 and 2: 0.6).
    Scored on seeds 1-2 only, A is worth 0.6, not the 0.7 of all three seeds: in the (accuracy, MACs) plane scaled
    to the table's bounds (accuracy 0.5..0.9, MACs 10..40) A sits at (1 - 0.1 / 0.4, 0) = (0.75, 0), so its front's
    hypervolume is 0.25 (0.5 with the leak); the best under 15 M MACs is A at 0.6, on seeds [0.6, 0.6]."""
    from types import SimpleNamespace

    import optuna

    from archspec.search._tabulation.oracle import OracleTable

    finals = {"A": [0.9, 0.6, 0.6], "C": [0.5, 0.5, 0.5], "D": [0.9, 0.9, 0.9]}
    macs = {"A": 10, "C": 40, "D": 40}
    rows = {k: {s: {"final_accuracy": f, "macs": macs[k], "tse": [[10, 1.0, 5.0]]} for s, f in enumerate(v)}
            for k, v in finals.items()}
    table = OracleTable(file="t", space="s", rows=rows, latency_ms={}, meta={"reference_seeds": [0, 1, 2]})
    truth = works.Truth(table)
    trial = SimpleNamespace(number=0, state=optuna.trial.TrialState.COMPLETE, values=[0.9],
                            user_attrs={"status": "trained", "arch_key": "A", "oracle_seed": 0})
    (row,) = works.trace(SimpleNamespace(trials=[trial]), truth, seed=0, steps=10, macs_budget=15e6)
    assert row["hv_macs"] == pytest.approx(0.25)
    assert row["best_under_budget"] == pytest.approx(0.6) and row["best_under_budget_seeds"] == [0.6, 0.6]
    assert row["seconds"] == pytest.approx(5.0)  # the answering row's training seconds to step 10


def test_batch_rate_counts_20_repeat_batches_below_005(works):
    """a always above b: every batch of 20 gives Wilcoxon's smallest one-sided p, 2**-20: rate 1.  a equal to b: no
    difference, p 1: rate 0.  a below b: rate 0 (one-sided)."""
    b = [0.1 * i for i in range(40)]
    assert works.batch_rate([x + 0.01 for x in b], b, batches=50) == 1.0
    assert works.batch_rate(b, b, batches=50) == 0.0
    assert works.batch_rate([x - 0.01 for x in b], b, batches=50) == 0.0


def test_stratified_choice_takes_the_best_score_of_each_cost_bin(works):
    """Six designs, costs 1..6, two bins of three: {a, b, c} and {d, e, f}; by score the best of each (c, d); without
    a score one of each bin."""
    import random

    cost = dict(zip("abcdef", range(1, 7)))
    score = {"a": 0.1, "b": 0.2, "c": 0.9, "d": 0.8, "e": 0.5, "f": 0.7}
    assert works.stratified_choice(list("fedcba"), cost, score, 2, random.Random(0)) == ["c", "d"]
    drawn = works.stratified_choice(list("abcdef"), cost, None, 2, random.Random(3))
    assert drawn[0] in "abc" and drawn[1] in "def"


@pytest.mark.slow  # 1.5-3.4 s in the quick subset (docs/contributing.md: over a second is slow)
def test_priors_read_each_designs_zero_cost_score_at_the_seed_that_answers_it(works, monkeypatch):
    """The leak-free rule: a design's zero-cost score is the one of the row whose seed answers its proxy.  A table
    whose score is a seed's final accuracy (a perfect 'lucky init' detector) must give the rule nothing over random
    draws when read at the answering seed, and a large edge when read at one seed for every design."""
    import random

    rng = random.Random(0)
    keys = [f"d{i:02d}" for i in range(40)]

    class Table:
        seeds = [0, 1, 2]
        tabulated = keys
        latency_ms = {k: 1.0 + i for i, k in enumerate(keys)}
        rows = {}

    for i, k in enumerate(keys):  # designs equal in expectation: only seed noise differs
        Table.rows[k] = {}
        for s in Table.seeds:
            final = 0.7 + rng.gauss(0, 0.02)
            Table.rows[k][s] = {"final_accuracy": final, "macs": 1000 + i, "zc": {"synflow": final},
                                "curve": [[100, 0.5, 1.0]], "tse": [[100, 50.0 + rng.random(), 1.0]]}
    import archspec.search as search

    monkeypatch.setattr(search, "load_table", lambda path: Table)
    monkeypatch.setattr(works, "proxy_value", lambda row, score, steps: -row["tse"][0][1])
    rules = {"best synflow": ("latency", "synflow")}
    fair = works.priors("t", rules, 60, 8, 100)["rules"]["best synflow"]
    leaky = works.priors("t", rules, 60, 8, 100, zc_seed="one")["rules"]["best synflow"]
    assert fair["hv_latency"]["p"] > 0.05
    assert leaky["hv_latency"]["p"] < 0.01


def test_holm_by_hand(works):
    """m = 3: sorted 0.01, 0.03, 0.04 -> 0.03, 0.06, max(0.06, 0.04) = 0.06 (monotone); capped at 1."""
    got = works.holm({"a": 0.01, "b": 0.04, "c": 0.03})
    assert got == pytest.approx({"a": 0.03, "c": 0.06, "b": 0.06})
    assert works.holm({"a": 0.6, "b": 0.7}) == pytest.approx({"a": 1.0, "b": 1.0})


def _decision_inputs(rates: float = 0.05):
    """Two candidates against baseline B.  Four p sorted: C 0.0001, A 0.001, A 0.002, C 0.2, times 4, 3, 2, 1 ->
    A 0.003 / 0.004 (gains +0.03 / +0.01, best under budget 0.776 vs B's 0.777: within 0.002), C 0.0004 / 0.2."""
    def test(p, gain):
        return {"wilcoxon_p": p, "median": 0.5 + gain, "baseline_median": 0.5}

    paired = {"A": {"hv_latency_at_budget": test(0.001, 0.03), "hv_macs_at_budget": test(0.002, 0.01)},
              "C": {"hv_latency_at_budget": test(0.0001, 0.05), "hv_macs_at_budget": test(0.2, 0.0)}}
    best = {"A": 0.776, "C": 0.79, "B": 0.777}
    result = {"baseline": "B", "paired_tests": paired,
              "comparison": {"methods": {m: {"best_under_budget_at_budget": {"median": v}} for m, v in best.items()}}}
    null = {"test": {f"{p}_{r}": {"batch20_rate_p05": rates} for p in ("hv_latency", "hv_macs")
                     for r in ("final", "at_budget")}}
    return result, null


def test_the_pre_registered_rule_by_hand(works):
    result, null = _decision_inputs()
    decision = works.choose(result, null)
    rows = decision["candidates"]
    assert rows["A"]["p_holm"] == pytest.approx({"hv_latency": 0.003, "hv_macs": 0.004})
    assert rows["C"]["p_holm"] == pytest.approx({"hv_latency": 0.0004, "hv_macs": 0.2})
    assert rows["A"]["qualifies"] and not rows["C"]["qualifies"]
    assert decision["chosen"] == "A" and decision["replaced"] and not decision["protocol_broken"]
    result["comparison"]["methods"]["A"]["best_under_budget_at_budget"]["median"] = 0.7745  # 0.0025 below B
    decision = works.choose(result, null)
    assert decision["chosen"] == "B" and not decision["replaced"]


def test_a_null_run_over_eight_percent_breaks_the_protocol(works):
    result, null = _decision_inputs(rates=0.09)
    decision = works.choose(result, null)
    assert decision["protocol_broken"] and decision["chosen"] == "B"
    assert not any(row["qualifies"] for row in decision["candidates"].values())


def test_the_bench_strata_rule_is_the_shipped_one(works):
    """Six designs, cost 1..6, scores favour 2, 3 and 6 in bins {1,2} {3,4} {5,6}: the bench's rule returns the shipped
    picks (bins visited 0, 2, 1); with no score, one design of each bin."""
    import random

    keys = [f"k{c}" for c in range(1, 7)]
    cost = {f"k{c}": float(c) for c in range(1, 7)}
    score = {"k1": 0.1, "k2": 0.5, "k3": 0.9, "k4": 0.2, "k5": 0.3, "k6": 0.4}
    assert works.stratified_choice(keys, cost, score, 3, random.Random(0)) == ["k2", "k6", "k3"]
    picks = works.stratified_choice(keys, cost, None, 3, random.Random(0))
    assert sorted((int(k[1:]) + 1) // 2 for k in picks) == [1, 2, 3]
    assert works._finite(0.0) == 0.0 and works._finite(None) == float("-inf")


def test_every_live_method_is_the_replayed_one(bench_module, works, tmp_path):
    """bench/search_live.py's methods parse as `archspec search` command lines, and each one that
    bench/search_works.py also replays runs with the same sampler, start-up draws, zero-cost score and proxy score
    (a live check of a method must run what the replays measured)."""
    from archspec.cli.app import make_parser

    live = bench_module("search_live")
    parser = make_parser()
    for name in live.METHODS:
        args = parser.parse_args(live.command(name, tmp_path / "o", 0, 540.0, [])[3:])
        replayed = works.METHODS.get(name)
        if replayed is None or name == "archspec default":
            continue
        assert args.sampler == replayed.get("sampler"), name
        assert args.fidelity == replayed.get("fidelity", args.fidelity), name
        if "sampler_startup" in replayed:
            assert args.sampler_startup == replayed["sampler_startup"], name
        if "zc_score" in replayed:
            assert args.zc_score == replayed["zc_score"], name
        assert (args.proxy_score or "accuracy") == replayed.get("protocol", {}).get("score", "accuracy"), name
        if args.sampler == "strata":
            assert args.strata == 20, name  # the replays' 20 trained candidates


def test_a_flat_cost_plane_scores_the_best_accuracy_alone(works):
    """Mask placements have equal MACs: every design sits at 0 on that axis (no division by a zero span), and the
    plane's hypervolume is 1 - the best front design's normalised error; ``flat_costs`` names the plane."""
    from types import SimpleNamespace

    rows = {k: {0: {"final_accuracy": acc, "macs": 5_000_000}} for k, acc in (("a", 0.6), ("b", 0.7), ("c", 0.8))}
    table = SimpleNamespace(seeds=[0], tabulated={"a", "b", "c"}, rows=rows, latency_ms={})
    truth = works.Truth(table)
    assert truth.flat_costs == ["macs"]
    assert truth.normalised("b", "macs") == pytest.approx((0.5, 0.0))
    points = [truth.normalised(k, "macs") for k in ("a", "b")]
    assert works.hypervolume_2d(points, (1.0, 1.0)) == pytest.approx(0.5)  # b's accuracy alone


def test_seed_power_by_hand(works):
    """Thirty designs, three seeds.  Means 0.50 .. 0.79 and seed noise of +-0.0001: within SD 0.0001, the 3-seed
    means rank alike -- predicted tau 1.  One mean for all and noise of +-0.01 (seeds -1, 0, +1 times it): within SD
    0.01, between SD 0 -- predicted tau about 0."""
    from types import SimpleNamespace

    def table(mean, noise):
        return SimpleNamespace(file="t", rows={f"d{i}": {s: {"final_accuracy": mean(i) + noise * (s - 1)}
                                                         for s in range(3)} for i in range(30)})

    sharp = works.seed_power(table(lambda i: 0.5 + 0.01 * i, 0.0001), draws=200)
    assert sharp["within_sd"] == pytest.approx(0.0001) and sharp["between_sd"] == pytest.approx(0.0880, abs=1e-3)
    assert sharp["models"]["normal"]["predicted_tau_median"] > 0.99
    flat = works.seed_power(table(lambda i: 0.7, 0.01), draws=200)
    assert flat["within_sd"] == pytest.approx(0.01) and flat["between_sd"] == 0.0
    assert abs(flat["models"]["normal"]["predicted_tau_median"]) < 0.1 and flat["models"]["normal"][
        "p_tau_at_least_bar"] == 0.0


def test_seed_power_takes_shared_seed_effects_out_by_hand(works):
    """Thirty designs 0.0001 apart, six seeds; seed s adds 0.01 * (s - 2.5) to every design (a seed effect shared by
    all, as a table seed's batches and initial weights are) and design i gets +-0.00005 by the parity of i + s (a
    small interaction).  Per design the seeds spread by SD 0.0187 (the seed effect), ten times the designs' spread,
    so the independent-seeds model predicts tau about 0; the additive model's interaction mean square is
    0.00005^2 * n k / ((n - 1)(k - 1)) = (0.00005 * sqrt(180 / 145))^2, its seed-effect SD 0.0187, and the 3-seed
    means rank as the designs do: tau about 1."""
    from types import SimpleNamespace

    rows = {f"d{i}": {s: {"final_accuracy": 0.7 + 0.0001 * i + 0.01 * (s - 2.5) + 0.00005 * (-1) ** (i + s)}
                      for s in range(6)} for i in range(30)}
    got = works.seed_power(SimpleNamespace(file="t", rows=rows), draws=200)
    assert got["within_sd"] == pytest.approx(0.0187, abs=1e-4)
    assert got["models"]["normal"]["predicted_tau_median"] < 0.2
    shared = got["shared_seeds"]
    assert shared["seeds"] == [0, 1, 2, 3, 4, 5] and shared["designs"] == 30
    assert shared["seed_effect_sd"] == pytest.approx(0.0187, abs=1e-4)
    assert shared["interaction_sd"] == pytest.approx(0.00005 * (180 / 145) ** 0.5, rel=1e-6)
    assert got["models"]["shared seeds, normal"]["predicted_tau_median"] > 0.9


def test_seed_power_draws_distinct_designs_by_hand(works):
    """Twelve designs 0.01 apart, three seeds of +-0.0001: every pair of distinct designs ranks alike, so drawn
    without replacement (``distinct``) the 12 designs' empirical tau is 1 in every draw; drawn with replacement, a
    pair that drew one design twice has equal true means and ranks at random, so some draws fall below 1.  Drawing
    13 designs without replacement from 12 is refused by name, and so are 12 once one design lacks a seed the others
    hold (the shared-seeds model then reads 11)."""
    from types import SimpleNamespace

    table = SimpleNamespace(file="t", rows={f"d{i}": {s: {"final_accuracy": 0.5 + 0.01 * i + 0.0001 * (s - 1)}
                                                      for s in range(3)} for i in range(12)})
    distinct = works.seed_power(table, designs=12, draws=200, distinct=True)["models"]["empirical"]
    assert distinct["predicted_tau_median"] == pytest.approx(1.0) and distinct["p_tau_at_least_bar"] == 1.0
    drawn = works.seed_power(table, designs=12, draws=200)["models"]["empirical"]
    assert drawn["predicted_tau_median"] < 0.99
    with pytest.raises(ValueError, match="--distinct draws 13 designs without replacement from the 12 read"):
        works.seed_power(table, designs=13, draws=200, distinct=True)
    del table.rows["d11"][2]  # d11 lacks seed 2: the shared-seeds model reads 11 designs holding seeds 0-2
    with pytest.raises(ValueError, match="--distinct draws 12 designs without replacement from the 11 read"):
        works.seed_power(table, designs=12, draws=200, distinct=True)


def test_seed_power_reads_a_curve_step_by_hand(works):
    """``step`` reads the curve's top-1 at that step instead of final top-1: rows whose final top-1 is pure seed
    noise but whose step-2 curve point is the shared-seeds case above (tau about 1 there, about 0 at the end),
    and a step the curves lack is refused by name."""
    from types import SimpleNamespace

    rows = {f"d{i}": {s: {"final_accuracy": 0.7 + 0.01 * (-1) ** (i + s) * (s % 3),
                          "curve": [[1, 0.1, 2.0], [2, 0.7 + 0.0001 * i + 0.01 * (s - 2.5) + 0.00005 * (-1) ** (i + s),
                                                  1.0]]}
                      for s in range(6)} for i in range(30)}
    table = SimpleNamespace(file="t", rows=rows)
    at2 = works.seed_power(table, draws=200, step=2)
    assert at2["shared_seeds"]["interaction_sd"] == pytest.approx(0.00005 * (180 / 145) ** 0.5, rel=1e-6)
    assert at2["models"]["shared seeds, normal"]["predicted_tau_median"] > 0.9
    assert at2["mean_top1"] == pytest.approx(0.7 + 0.0001 * 14.5)  # the seed effects and parities average out
    assert works.seed_power(table, draws=200)["models"]["shared seeds, normal"]["predicted_tau_median"] < 0.3
    with pytest.raises(ValueError, match="no curve point at step 3"):
        works.seed_power(table, draws=200, step=3)


def test_mask_effects_recover_additive_slopes_by_hand(works):
    """Nine placements (a, b in 0..2) at two seeds, final top-1 = 0.5 + 0.01 a + 0.002 b + 0.003 seed exactly:
    slopes 1.0 and 0.2 points per masked head, residual 0, fitted range 2 x 1.0 + 2 x 0.2 = 2.4 points, and the
    fitted SD over the 3 x 3 grid sqrt((2/3 + 0.04 x 2/3) x 9/8) = 0.8832 points.  With one row less than effects
    (4: two seeds, two slopes) it refuses, as it does an empty table and one whose parameters are not numbers."""
    from types import SimpleNamespace

    rows = {f"{a}{b}": {s: {"seed": s, "params": {"a": a, "b": b},
                            "final_accuracy": 0.5 + 0.01 * a + 0.002 * b + 0.003 * s} for s in (0, 1)}
            for a in range(3) for b in range(3)}
    got = works.mask_effects(SimpleNamespace(file="t", rows=rows))
    assert got["slopes"] == pytest.approx({"a": 1.0, "b": 0.2}) and got["seeds"] == [0, 1]
    assert got["residual_sd"] == pytest.approx(0.0, abs=1e-9) and got["rows"] == 18
    assert got["range"] == pytest.approx(2.4) and got["grid_sd"] == pytest.approx(0.8832, abs=1e-4)
    few = {k: rows[k] for k in ("00", "11")}
    with pytest.raises(ValueError, match="4 rows cannot fit 4 effects"):
        works.mask_effects(SimpleNamespace(file="t", rows=few))
    with pytest.raises(ValueError, match="0 rows cannot fit 0 effects"):
        works.mask_effects(SimpleNamespace(file="t", rows={}))
    design_rows = {k: {s: {**row, "params": {"a": "mhsa", "b": 1}} for s, row in by.items()} for k, by in rows.items()}
    with pytest.raises(ValueError, match="not a mask-placement table"):
        works.mask_effects(SimpleNamespace(file="t", rows=design_rows))


def test_design_costs_compare_the_cost_rule_with_the_seeds_clocks_by_hand(works):
    """Design a: seed 0 spends 10 s a span, seed 1 30 s on the first span (paused) and 10 s on the second.  Charged
    to step 20: 10 + 10 = 20 s against the seeds' mean clock (20 + 40) / 2 = 30 s -> 0.667.  Design b: both seeds
    5 s a span -> 10 s either way, 1.0.  Median 0.833; sums 40 -> 30 s."""
    from archspec.search._tabulation.oracle import OracleTable

    def row(key, seed, clock):
        return {"key": key, "seed": seed, "curve": [[10, 0.5, 1.0], [20, 0.6, 0.9]], "final_accuracy": 0.6,
                "tse": [[10, 2.0, clock[0]], [20, 4.0, clock[1]]]}

    rows = {"a": {0: row("a", 0, (10.0, 20.0)), 1: row("a", 1, (30.0, 40.0))},
            "b": {0: row("b", 0, (5.0, 10.0)), 1: row("b", 1, (5.0, 10.0))}}
    table = OracleTable(file="hand.jsonl", space="hand", rows=rows, latency_ms={}, meta={})
    got = works.design_costs(table, (20,))["steps"][20]
    assert got["median_ratio"] == pytest.approx((2 / 3 + 1) / 2) and got["min_ratio"] == pytest.approx(2 / 3)
    assert got["sum_old_s"] == pytest.approx(40.0) and got["sum_new_s"] == pytest.approx(30.0)


def test_a_paused_row_has_a_span_over_five_times_its_median_rate_by_hand(works):
    """Spans of 1, 1 and 10 s a step: median 1, 10 > 5 -> paused; 1, 1 and 4 s a step: 4 < 5 -> not."""
    paused = {"tse": [[10, 1.0, 10.0], [20, 2.0, 20.0], [30, 3.0, 120.0]]}
    steady = {"tse": [[10, 1.0, 10.0], [20, 2.0, 20.0], [30, 3.0, 60.0]]}
    assert works.paused_row(paused) and not works.paused_row(steady)


def test_cost_binned_ranks_within_quantile_bins_by_hand(works):
    """Twelve designs of costs 1..12 in 3 quantile bins of four.  References 0.1..0.4 in each bin; the proxy ranks
    bin 1 right (tau 1, regret 0), bin 2 backwards (tau -1, its pick 0.1 against 0.4: -0.3), and swaps the top two
    of bin 3 (5 of 6 pairs concordant: tau 2/3, pick 0.3: -0.1).  Size-weighted tau 2/9, mean regret -0.4/3.
    In 4 bins every bin holds three designs, too few for a tau."""
    import numpy as np

    reference = np.array([0.1, 0.2, 0.3, 0.4] * 3)
    proxy = np.array([1, 2, 3, 4, 4, 3, 2, 1, 1, 2, 4, 3], float)
    cost = np.arange(1, 13, dtype=float)
    got = works.cost_binned(proxy, reference, cost, 3)
    assert got["tau"] == pytest.approx(2 / 9) and got["regret"] == pytest.approx(-0.4 / 3)
    assert works.cost_binned(proxy, reference, cost, 4)["tau"] is None


def test_the_rules_fidelity_reads_the_round1_row_of_the_same_seed_by_hand(works, monkeypatch):
    """Six placements of mait_small's three groups, the same final top-1 at every seed (0.7 + 0.01 m_0-1 + 0.001
    m_2-3).  The round-1 row (1/1/1) puts head 0 of group 0-1 at 0.9 above uniform at seeds 0 and 2, at 0.1 at seed
    1, every other group at 0.5 (the centre of 0.8 / 0.2): the rule's score is +-0.4 m_0-1 / 3, so seeds 0 and 2
    rank as m_0-1 does and seed 1 the reverse -- mean tau = tau(m_0-1, finals) / 3.  Its cost is the round-1
    design's seconds to the step (10 s at step 100)."""
    from scipy.stats import kendalltau

    groups = ("stages.0.heads_mix.masked.0-1", "stages.0.heads_mix.masked.2-3", "stages.0.heads_mix.masked.4-5")
    u = 361 / 49 / 50
    points = [(1, 1, 1), (0, 0, 0), (2, 1, 0), (3, 0, 2), (0, 3, 3), (2, 2, 2)]
    finals = [0.7 + 0.01 * m0 + 0.001 * m1 for m0, m1, _ in points]

    def row(counts, final, seed):
        head0 = 0.1 if (counts == (1, 1, 1) and seed == 1) else 0.9
        als = {f"0.{layer}": [u + (head0 if layer < 2 else 0.5) * (1 - u), u, u] for layer in range(6)}
        return {"key": "k" + "".join(map(str, counts)), "seed": seed, "params": dict(zip(groups, counts)),
                "final_accuracy": final, "curve": [[50, 0.5, 1.0], [100, 0.6, 0.9]],
                "tse": [[50, 40.0, 5.0], [100, 70.0, 10.0]], "als": [[50, als], [100, als]], "zc": {},
                "macs": 1, "n_params": 1}

    monkeypatch.setattr(works, "bootstrap_mean", lambda *args: (0.0, 0.0))  # the interval is tested on its own
    rows = [row(c, f, s) for s in (0, 1, 2) for c, f in zip(points, finals)]
    result = works.fidelity_table(rows, (0, 1, 2), als={"heads": 3, "u": u})
    rule = {f["fidelity"]: f for f in result["fidelities"] if f["fidelity"].startswith("MaiT's rule")}
    expected, _ = kendalltau([m0 for m0, _, _ in points], finals)
    at_100 = rule["MaiT's rule score, ALS of the round-1 row at step 100"]
    assert at_100["tau"] == pytest.approx(expected / 3, abs=1e-12)
    assert at_100["cost_s"] == pytest.approx(10.0)
    assert rule["MaiT's rule score, ALS of the round-1 row at step 50"]["cost_s"] == pytest.approx(5.0)
    without = works.fidelity_table([r for r in rows if r["key"] != "k111"], (0, 1, 2), als={"heads": 3, "u": u})
    assert not [f for f in without["fidelities"] if f["fidelity"].startswith("MaiT's rule")]


def test_a_fidelity_every_design_shares_has_no_interval(works):
    """A mask table's MACs (the same for every placement): no resample gives a tau, so the interval is (nan, nan)
    rather than an error."""
    import math

    low, high = works.bootstrap_mean([[1.0, 1.0, 1.0, 1.0]], [[0.1, 0.2, 0.3, 0.4]], n=20)
    assert math.isnan(low) and math.isnan(high)


def test_a_mask_tables_geometry_comes_from_its_sidecar(works, tmp_path):
    """The shipped mait_small sidecar names its space and 3x3 window: 3 heads, u of a 7x7 grid with a class token;
    a table without a sidecar, or whose protocol records no ALS, has none."""
    shipped = works.table_file("mait_small")
    assert shipped.name == "mait_small.jsonl" and shipped.is_file()
    assert works.als_geometry(shipped) == {"heads": 3, "u": pytest.approx(361 / 49 / 50)}
    assert works.als_geometry(tmp_path / "t.jsonl") is None
    (tmp_path / "t.meta.json").write_text(json.dumps({"protocol": {"space": "levit_small"}}))
    assert works.als_geometry(tmp_path / "t.jsonl") is None
