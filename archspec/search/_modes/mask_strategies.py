"""Mode 2's strategies as clients of the engine's contract (:mod:`archspec.search._engine.mode`).

* :class:`OptunaPlacement` -- ``--strategy optuna``, a :class:`~archspec.search._engine.mode.SampledMode`: Optuna over
  :func:`~archspec.search._space.language.mask_placement_space`; after each training it records the ALS (3x3 window, on
  :data:`~archspec.search._evaluation.mask_scores.ALS_IMAGES` held-out images), and at the end writes the best trial's
  heatmap and als.json.
* :class:`AlsPlacement` -- ``--strategy als``, a :class:`~archspec.search._engine.mode.RoundsMode`: MaiT sec. 4.2's
  rounds, head 0 masked everywhere, then assignment and calibration from the ALS
  (:mod:`archspec.families.attention.placement`).
* :class:`SoftPlacement` -- ``--strategy soft``, a :class:`~archspec.search._engine.mode.RoundsMode`: sec. 4.3, one
  soft-masked training, then a hard mask where the learned alpha is low.

Both rounds strategies write best.yaml (the placement on the spec at its real input size, with provenance),
an ALS heatmap, als.json and summary.json's mask entries (:class:`PlacementRounds`).
"""

from __future__ import annotations

import sys
from pathlib import Path

from optuna.trial import TrialState

from archspec.families.attention.placement import (
    Placement,
    assign_from_als,
    calibrate,
    normalise_als,
    soft_placement,
)
from archspec.ir.analysis import analyze
from archspec.ir.checked import load_spec
from archspec.search._engine.mode import Candidate, RoundResult, RoundsMode, RunContext, SampledMode
from archspec.search._evaluation.mask_scores import als_images, layer_scores, learned_alphas, uniform_baselines
from archspec.search._report import plots, results, run_files
from archspec.search._space.mask_placement import (
    als_table,
    apply_placement,
    attention_layers,
    head0_placement,
    layer_label,
    placement_heads,
    placement_json,
    provenance_free_yaml,
    soft_heads,
)
from archspec.spec import ArchSpec

__all__ = ["OptunaPlacement", "PlacementRounds", "AlsPlacement", "SoftPlacement"]


# ----------------------------------------------------------------------------------- --strategy optuna
class OptunaPlacement(SampledMode):
    """``--strategy optuna``: ``space`` (a mask-placement space of ``spec``) searched by the engine; the ALS of every
    trained trial on the trial (user attr ``als``), the best trial's als.png and als.json at the end."""

    label = "masks/optuna"

    def __init__(self, space, attrs: dict):
        self.space, self.attrs = space, attrs
        self.data = None  # the search's data, kept from the first training for the ALS images

    def study_attrs(self) -> dict:
        return self.attrs

    def train(self, spec, data, protocol, seed=0, report=None, on_model=None, progress=None):
        """The default training, keeping the data for the ALS images
        (:func:`~archspec.search._evaluation.mask_scores.als_images`)."""
        self.data = data
        return super().train(spec, data, protocol, seed=seed, report=report, on_model=on_model, progress=progress)

    def after_train(self, trial, spec, result) -> None:
        """ALS per layer and head of the trained model on the trial (user attr ``als``); never fails the trial."""
        model = getattr(result, "model", None)
        if model is None or self.data is None:
            return
        try:
            scores = layer_scores(model, als_images(self.data, result), (3, 3))
            trial.set_user_attr("als", {f"{s}.{l}": v for (s, l), v in scores.items()})
        except Exception:  # noqa: BLE001 - ALS is a diagnostic; never fail a trained trial over it
            pass

    def finish(self, study, run_dir: Path, summary: dict, files: list[str], best_file):
        """als.png and als.json of the best trial, when it has ALS; never replaces ``best_file`` (returns None)."""
        best = summary.get("best_trial")
        if best is None:
            return None
        trial = study.trials[best]
        scores = trial.user_attrs.get("als")
        if scores:
            best_spec = load_spec(trial.user_attrs["spec"])
            keys = {tuple(int(p) for p in k.split(".")): v for k, v in scores.items()}
            placement = {(s, l): [h.mask is not None for h in heads] for s, l, heads in attention_layers(best_spec)}
            table, masked = als_table(best_spec, keys, placement)
            run_files.atomic_write_text(run_dir / "als.json", results.summary_json({"trial": best, "window": "3x3",
                                                                               "als": table, "masked": masked}))
            plots.plot_als_heatmap(table, run_dir / "als.png",
                                    f"{summary['study']}: ALS of best trial {best} (3x3 window)", masked)
            files.extend(["als.png", "als.json"])
        return None


# ----------------------------------------------------------------------------------- rounds strategies
class PlacementRounds(RoundsMode):
    """What ``als`` and ``soft`` share: the spec, window and thresholds, the study attrs, the ALS read after each
    training, and the results (best.yaml with provenance, als.json, summary entries).

    Subclasses propose the rounds and decide ``self.placement`` (``None``: nothing decided) and ``self.extra``
    (als.json's and summary.json's strategy entries)."""

    strategy = "masks"

    def __init__(self, spec: ArchSpec, mcfg, window: tuple[int, int], high: float, low: float):
        self.spec, self.mcfg, self.window, self.high, self.low = spec, mcfg, window, high, low
        self.label = f"masks/{mcfg.strategy}"
        self.rounds_log: list[dict] = []
        self.baselines: dict[tuple[int, int], float] = {}
        self.placement: Placement | None = None
        self.extra: dict = {}

    def study_attrs(self) -> dict:
        cfg, mcfg = self.mcfg.search, self.mcfg
        return {"mode": self.label, "spec": self.spec.name, "strategy": mcfg.strategy,
                "proxy": cfg.protocol.describe(), "data": cfg.data or "embedded", "seed": cfg.seed,
                "thresholds": {"als_high": self.high, "als_low": self.low, "alpha_threshold": mcfg.alpha_threshold},
                "window": list(self.window), "rounds": mcfg.rounds}

    def start(self, run: RunContext) -> None:
        super().start(run)
        self.rounds_dir = run.run_dir / "rounds"
        self.chance = 1.0 / max(run.data.num_classes, 1)

    def candidate(self, round_index: int, spec: ArchSpec, label: str) -> Candidate:
        """Round ``round_index`` training ``spec`` (its trial records the strategy first)."""
        progress = f"{self.mcfg.strategy} round {round_index}" if self.run.cfg.progress else None
        return Candidate(spec, round_index, label, {"strategy": self.mcfg.strategy}, progress)

    def after_train(self, trial, spec, result) -> dict:
        """ALS per layer and head (user attr ``als``) and the layers' uniform baselines; returns the ALS."""
        scores = layer_scores(result.model, als_images(self.run.data, result), self.window)
        self.baselines.update(uniform_baselines(result.model, self.window))
        trial.set_user_attr("als", {f"{s}.{l}": v for (s, l), v in scores.items()})
        return scores

    def check_learned(self, label: str, accuracy: float) -> None:
        """Note a round whose proxy accuracy is near chance: its attention says little."""
        if accuracy < 1.5 * self.chance:
            self.run.notes.append(f"{label}: proxy accuracy {accuracy:.3f} is near chance ({self.chance:.3f}): the "
                                  "model hardly learned, so its attention (and the placement read from it) says "
                                  "little; raise --proxy-steps or --proxy-lr")

    # ------------------------------------------------------------------ results
    def summary(self, interrupted: bool) -> dict:
        """summary.json's mask entries; an interrupted run decided nothing (no placement, no strategy entries)."""
        if interrupted:
            self.placement, self.extra = None, {}
        mcfg, cfg, window, data, run = self.mcfg, self.run.cfg, self.window, self.run.data, self.run
        summary = {
            "mode": self.label, "study": run.name, "storage": run.info.url, "run_dir": str(run.run_dir),
            "strategy": mcfg.strategy, "spec": self.spec.name, "window": f"{window[0]}x{window[1]}",
            "thresholds": ({"als_high": self.high, "als_low": self.low} if mcfg.strategy == "als"
                           else {"alpha_threshold": mcfg.alpha_threshold}),
            "data": data.describe() if hasattr(data, "describe") else {"name": getattr(data, "name", None)},
            "proxy": cfg.protocol.describe(), "latency_protocol": cfg.latency.describe(), "seed": cfg.seed,
            "notes": run.notes, "interrupted": interrupted, **self.extra,
        }
        empty = self.empty_note(interrupted)
        if empty is not None:
            summary["notes"].insert(0, empty)
            summary["no_locality"] = True
        return summary

    def empty_note(self, interrupted: bool) -> str | None:
        """The note for a placement that masks no head at all (MaiT's rule found no local layer): what it means
        and what to try; ``None`` when some head stays masked (or nothing was decided)."""
        placement = self.placement
        if placement is None or interrupted or any(sum(v) for v in placement.values()):
            return None
        return self.no_locality_note(self.run.cfg.protocol.steps)

    def no_locality_note(self, steps: int) -> str:
        return (f"no layer became local after {steps} proxy steps: no masked head reached ALS {self.high:g}, so "
                "best.yaml is the unmasked model; train longer with --proxy-steps, or use --strategy soft")

    def write_results(self, summary: dict, interrupted: bool) -> Path | None:
        """trials.csv, best.yaml (when a placement was decided and not interrupted) and als.json."""
        run, best_file = self.run, None
        self._summarise_trials(summary)
        if self.placement is not None and not interrupted:
            best_file = self._write_best(summary)
        else:
            summary["notes"].append("no placement decided: no best.yaml written")
        als_blob = {"window": f"{self.window[0]}x{self.window[1]}", "strategy": self.mcfg.strategy, **self.extra}
        run_files.atomic_write_text(run.run_dir / "als.json", results.summary_json(als_blob))
        run.files += ["als.json", "summary.json"]
        summary["files"] = run.files
        return best_file

    def trained_this_run(self) -> int:
        return int(self.placement is not None)

    def _summarise_trials(self, summary: dict) -> None:
        """trials.csv, and the study's counts, failures and median trial time into ``summary``."""
        trials = self.run.study.get_trials(deepcopy=False)
        results.write_trials_csv(trials, self.run.run_dir / "trials.csv")
        self.run.files.insert(0, "trials.csv")
        done = [t for t in trials if t.state == TrialState.COMPLETE]
        summary["counts"] = {"trained": len(done), "failed": sum(t.state == TrialState.FAIL for t in trials)}
        summary["trained_this_run"] = self.trained_this_run()
        summary["notes"].extend(_round_lines(self.rounds_log))
        summary["failures"] = [{"trial": t.number, "reason": t.user_attrs.get("fail_reason", "unknown")}
                               for t in trials if t.state == TrialState.FAIL]
        durations = [t.duration.total_seconds() for t in done if t.duration is not None]
        summary["per_trial_seconds"] = round(sorted(durations)[len(durations) // 2], 2) if durations else None

    def _write_best(self, summary: dict) -> Path:
        """best.yaml: the spec with the decided placement, and its provenance; returns its path."""
        spec, window, rounds_log, extra, run = self.spec, self.window, self.rounds_log, self.extra, self.run
        placement = self.placement
        final_spec = apply_placement(spec, placement_heads(spec, placement, window))
        analysis = analyze(final_spec)
        masked_total = sum(sum(v) for v in placement.values())
        prov = {
            "study": run.name, "trial": [r["trial"] for r in rounds_log] or extra.get("trial"),
            "strategy": self.mcfg.strategy, "storage": run.info.url, "source_spec": spec.name,
            "objectives": {"proxy_accuracy_of_last_trained_round": (rounds_log[-1]["accuracy"] if rounds_log
                                                                    else extra.get("accuracy"))},
            "macs": analysis.macs, "params": analysis.params, "input": list(final_spec.input.resolution),
            "window": f"{window[0]}x{window[1]}", "thresholds": summary["thresholds"],
            "placement": placement_json(spec, placement), "masked_heads": masked_total,
            "data": summary["data"], "proxy": summary["proxy"], "seed": run.cfg.seed, "created": run_files.now_iso(),
        }
        if summary.get("no_locality"):
            prov["note"] = summary["notes"][0]
        _, text = run_files.emit_spec(final_spec, None, f"{spec.name}_{self.mcfg.strategy}"[:100], prov)
        best_file = run_files.atomic_write_text(run.run_dir / "best.yaml", text)
        run.files.insert(0, "best.yaml")
        summary.update(best=str(best_file), masked_heads=masked_total, placement=placement_json(spec, placement))
        summary["pareto"] = [{"rank": 0,
                              "trial": prov["trial"] if isinstance(prov["trial"], int) else prov["trial"][-1],
                              "accuracy": prov["objectives"]["proxy_accuracy_of_last_trained_round"],
                              "latency_ms": None, "macs": analysis.macs, "params": analysis.params,
                              "file": "best.yaml"}]
        summary["table_title"] = ("final placement (accuracy: the last trained round; the final placement "
                                  "itself is untrained)")
        return best_file


class AlsPlacement(PlacementRounds):
    """``--strategy als`` (MaiT sec. 4.2): round 1 masks head 0 of every attention layer and assigns masks from its
    ALS (``high`` / ``low`` thresholds); rounds 2.. (``--rounds``) calibrate; stops early once a calibration changes
    nothing.  ``mcfg.normalise``: decide on the ALS above uniform attention."""

    def __init__(self, spec: ArchSpec, mcfg, window: tuple[int, int], high: float, low: float):
        super().__init__(spec, mcfg, window, high, low)
        self.next_placement: Placement = head0_placement(spec)
        self.round_index, self.done = 0, False
        self.extra = {"rounds": self.rounds_log}

    def propose(self) -> Candidate | None:
        if self.done or self.round_index >= self.mcfg.rounds:
            return None
        self.round_index += 1
        r = self.round_index
        self.round_spec = apply_placement(self.spec, placement_heads(self.spec, self.next_placement, self.window))
        return self.candidate(r, self.round_spec, f"round {r}")

    def observe(self, candidate: Candidate, outcome: RoundResult | None) -> None:
        if outcome is None:
            self.done = True
            return
        r, placement = candidate.round, self.next_placement
        self.check_learned(f"round {r}", outcome.result.accuracy)
        new = self._decide_round(r, outcome.trial, outcome.result.accuracy, outcome.extra, placement)
        run_files.atomic_write_text(self.rounds_dir / f"round{r}.yaml", provenance_free_yaml(candidate.spec))
        changed, self.next_placement = new != placement, new
        self.placement = new
        if r >= 2 and not changed:
            self.run.notes.append(f"placement unchanged by the calibration of round {r}: stopped")
            self.done = True

    def trained_this_run(self) -> int:
        return len(self.rounds_log)

    def _decide_round(self, r: int, number: int, accuracy: float, scores: dict, placement: Placement) -> Placement:
        """Round ``r``'s decision from its ALS ``scores``: assignment (round 1) or calibration; plots the heatmap,
        logs the round, returns the next placement."""
        spec, window = self.spec, self.window
        decide = normalise_als(scores, self.baselines) if self.mcfg.normalise else scores
        table, masked = als_table(spec, decide, placement)
        raw_table, _ = als_table(spec, scores, placement)
        what = "ALS above uniform, (ALS-u)/(1-u)" if self.mcfg.normalise else "ALS (eq. 3)"
        plots.plot_als_heatmap(table, self.run.run_dir / f"als_round{r}.png",
                                f"{self.run.name}: round {r}, {what}, {window[0]}x{window[1]} window, trial {number}",
                                masked, (self.high, self.low))
        self.run.files.append(f"als_round{r}.png")
        if r == 1:
            new, decisions = assign_from_als(placement, decide, self.high, self.low)
        else:
            new, decisions = calibrate(placement, decide, self.low)
        self.rounds_log.append({
            "round": r, "trial": number, "step": "assignment" if r == 1 else "calibration",
            "accuracy": accuracy, "placement_trained": placement_json(spec, placement), "als": raw_table,
            "als_decided_on": table,
            "uniform_baseline": {layer_label(spec, k): round(v, 4) for k, v in self.baselines.items()},
            "decisions": {layer_label(spec, k): v for k, v in decisions.items()},
            "placement_next": placement_json(spec, new)})
        if self.run.cfg.progress:
            for key, text in decisions.items():
                print(f"round {r}: {layer_label(spec, key)}: {text}", file=sys.stderr, flush=True)
        return new


class SoftPlacement(PlacementRounds):
    """``--strategy soft`` (MaiT sec. 4.3): train every head soft-masked, keep a hard mask where the learned alpha
    is below ``mcfg.alpha_threshold``."""

    def __init__(self, spec: ArchSpec, mcfg, window: tuple[int, int], high: float, low: float):
        super().__init__(spec, mcfg, window, high, low)
        self.proposed = False

    def propose(self) -> Candidate | None:
        if self.proposed:
            return None
        self.proposed = True
        return self.candidate(1, apply_placement(self.spec, soft_heads(self.spec, self.window)), "soft-mask training")

    def observe(self, candidate: Candidate, outcome: RoundResult | None) -> None:
        if outcome is None:
            return
        spec, window, result = self.spec, self.window, outcome.result
        self.check_learned("soft-mask training", result.accuracy)
        alphas = learned_alphas(result.model)
        placement = soft_placement(alphas, self.mcfg.alpha_threshold)
        unknown = [layer_label(spec, k) for k, v in alphas.items() if any(a is None for a in v)]
        if unknown:
            self.run.notes.append(f"layers {unknown}: the window covers the whole proxy token grid, so the proxy "
                                  "model had no soft mask there (no alpha learned): left global")
        table, masked = als_table(spec, outcome.extra, placement)
        plots.plot_als_heatmap(table, self.run.run_dir / "als.png",
                                f"{self.run.name}: ALS of the soft-masked model ({window[0]}x{window[1]}), "
                                f"trial {outcome.trial}", masked, None)
        self.run.files.append("als.png")
        run_files.atomic_write_text(self.rounds_dir / "soft.yaml", provenance_free_yaml(candidate.spec))
        self.placement = placement
        self.extra = {"alphas": {layer_label(spec, k): v for k, v in alphas.items()}, "als": table,
                      "trial": outcome.trial, "accuracy": result.accuracy, "placement": placement_json(spec, placement)}

    def no_locality_note(self, steps: int) -> str:
        return (f"no layer became local after {steps} proxy steps: no learned alpha fell below "
                f"{self.mcfg.alpha_threshold:g}, so best.yaml is the unmasked model; train longer with "
                "--proxy-steps, or use a larger --proxy-size")


def _round_lines(rounds_log: list[dict]) -> list[str]:
    """One note line per ALS round: its step, trial, proxy accuracy and how many layers each decision took."""
    lines = []
    for r in rounds_log:
        kinds: dict[str, int] = {}
        for text in r["decisions"].values():
            word = text.split(" (")[0]
            kinds[word] = kinds.get(word, 0) + 1
        lines.append(f"round {r['round']} ({r['step']}, trial {r['trial']}, proxy acc {r['accuracy']:.3f}): "
                     + ", ".join(f"{n} layers {k}" for k, n in kinds.items()))
    return lines

