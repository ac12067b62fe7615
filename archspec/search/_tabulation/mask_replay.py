"""MaiT's mask-placement strategies replayed on a mask table (issue 52: `search masks` on a table in seconds),
torch-free.

A mask table (``archspec table SPACE`` on a ``kind: masks`` space such as ``mait_small``) holds, for every placement
point and seed, the learning curve and MaiT's ALS (eq. 3) of every layer and head at every curve step.  That is all
``strategy="als"`` reads of a trained model (:func:`archspec.search.run_masks`), so the rule can run on the table: each
"training" of a placement is the table row of one seed, drawn per replay and per point exactly as design replays
draw theirs (:meth:`~archspec.search._tabulation.oracle.OracleTable.seed_of`), and the placement it returns is scored on
the reference seeds that did not answer it (the leak-free reading of issue 54).

MaiT sec. 4.2 on a table whose space ties layers into groups (``mait_small``: one choice per group of two layers,
``stages.0.heads_mix.masked.0-1``: masked heads 0..m-1 of layers 0 and 1).  The rule decides per layer; a table
point is per group, so this replay decides per group on the group's ALS -- the mean over its layers, head by head
(a choice of this replay; MaiT has no groups):

1. round 1 trains head 0 masked in every layer (every group ``m = 1``: a table point) and assigns from head 0's
   ALS above uniform attention ``a``: ``a >= high`` masks every head (``m = H``), ``a <= low`` none (``m = 0``),
   otherwise head 0 only (``m = 1``) -- :func:`archspec.families.attention.placement.assign_from_als`;
2. rounds 2.. train that point and calibrate: a masked head whose own ALS is ``<= low`` loses its mask
   (:func:`~archspec.families.attention.placement.calibrate`); the group keeps as many masked heads as remain
   (the space masks heads 0..m-1: heads are exchangeable there, so a count is the placement); stop early when a
   calibration changes nothing, as the live rule does.

The uniform baseline ``u`` of a layer (:func:`uniform_als`) is what :func:`archspec.search._evaluation.mask_scores.
uniform_baselines` computes on a model, from the grid alone.

MaiT sec. 4.3 (``strategy="soft"``, :func:`replay_soft`) trains one model that is no point of the space, every head
soft-masked; a mask table's soft-mask sidecar holds its rows (learned alphas at every curve step), so it replays the
same way.  (The rule's first round read as a score of every placement, the table's "fidelity of ALS", is
``bench/search_works.py``'s ``rule_score``: research, not the product.)
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from archspec.errors import SpecError
from archspec.families.attention.placement import DEFAULT_ALS_HIGH, DEFAULT_ALS_LOW, assign_from_als, calibrate
from archspec.ir.analysis import analyze
from archspec.search._space.language import SPACES_DIR, SearchSpace, load_space
from archspec.search._space.mask_placement import parse_window, rule_thresholds
from archspec.search._tabulation.oracle import design_seconds, linear_at
from archspec.spec import ConvStageBase

__all__ = ["uniform_als", "mask_groups", "mask_depths", "mask_table_space", "als_at", "mask_geometry",
           "AlsReplay", "replay_als", "replay_soft", "table_replay_report", "check_als_rows", "shipped_spaces"]

# the per-group choice of a masks space (archspec.search._space.sampling's names): layers a-b, one layer, or the stage
_GROUP = re.compile(r"stages\.(\d+)\.heads_mix\.masked(?:\.(\d+)(?:-(\d+))?)?$")


def uniform_als(grid: tuple[int, int], window: tuple[int, int], num_prefix_tokens: int = 0) -> float:
    """ALS of uniform attention over ``N = rows * cols + num_prefix_tokens`` tokens: the mean over patch queries
    of ``|window neighbours inside the grid| / N`` (MaiT eq. 3 on a map of ``1/N``; windows clipped at the border,
    class tokens not neighbours).  7x7 with a 3x3 window and a class token: 361 / 49 / 50 = 0.1473.

    Raises:
        ValueError: a window side that is not odd and positive (a window is centred on its query, as
            :func:`archspec.families.attention.mask_terms.window_mask` requires).
    """
    if any(side < 1 or side % 2 == 0 for side in window):
        raise ValueError(f"window {window[0]}x{window[1]} must have odd positive sides (it is centred on the query)")
    rows, cols = grid
    wr, wc = window[0] // 2, window[1] // 2
    n = rows * cols + num_prefix_tokens
    inside = sum((min(r + wr, rows - 1) - max(r - wr, 0) + 1) * (min(c + wc, cols - 1) - max(c - wc, 0) + 1)
                 for r in range(rows) for c in range(cols))
    return inside / (rows * cols) / n


def mask_groups(params: dict[str, Any], depths: dict[int, int] | None = None) -> dict[str, tuple[int, list[int]]]:
    """``{parameter: (stage, [layers])}`` of a masks point's per-group choices: ``stages.0.heads_mix.masked.2-3``
    -> ``(0, [2, 3])``, ``masked.3`` (``group: 1``) -> ``(0, [3])``, and ``stages.0.heads_mix.masked`` (no
    ``group``: one count for the stage) -> ``(0, [0 .. depth - 1])`` with ``depths`` ``{stage: depth}``
    (:func:`mask_depths`).

    Raises:
        SpecError: a parameter that is not such a choice (the table is not of a per-group masks space), or a
            whole-stage choice without its stage's depth.
    """
    out = {}
    for name in params:
        match = _group_match(name)
        stage, first, last = int(match[1]), match[2], match[3] or match[2]
        if first is None and (depths is None or stage not in depths):
            raise SpecError.single(("oracle",), f"parameter {name!r} masks the whole stage: its layers need the "
                                   f"depth of stage {stage}", "read the table with its space (`depths`: mask_depths)",
                                   name)
        out[name] = (stage, list(range(depths[stage])) if first is None else list(range(int(first), int(last) + 1)))
    return out


def _group_match(name: str) -> re.Match:
    """The match of a per-group mask count's name.  Raises SpecError at ``oracle``: ``name`` is no such count."""
    match = _GROUP.match(name)
    if match is None:
        raise SpecError.single(("oracle",), f"parameter {name!r} is not a per-group mask count",
                               "a mask table of a kind: masks space (e.g. mait_small)", name)
    return match


def mask_depths(space: str | SearchSpace) -> dict[int, int]:
    """``{stage: depth}`` of a masks space's token stages (every point shares them: a mask changes no shape).

    Raises:
        SpecError: ``space`` is not a shipped space or a readable space file (:func:`load_space`).
    """
    spec = _first_spec(space)
    return {i: stage.depth for i, stage in enumerate(spec.stages) if not isinstance(stage, ConvStageBase)}


def _first_spec(space: str | SearchSpace):
    space = space if isinstance(space, SearchSpace) else load_space(space)
    return next(iter(space.points()))[1]


def mask_table_space(table, source: str | None = None) -> SearchSpace:
    """The ``kind: masks`` space that ``table`` (an :class:`~archspec.search._tabulation.oracle.OracleTable`)
    tabulates: ``source`` (a shipped space's name or a space file; default the table's own space, by name), whose
    name must be the table's, and whose per-group mask counts the table's points are.

    Raises:
        SpecError: at ``space``: ``source`` is no space or another space's, or (no ``source``) the table's space
            is no shipped space; at ``oracle``: the table's points are not per-group mask counts.
    """
    params = next(iter(next(iter(table.rows.values())).values()))["params"]
    for name in params:  # a mask table at all, before whose space it is
        _group_match(name)
    hint = f"give the space file of {table.space}, or leave `space` out for a shipped table"
    if source is None and table.space not in shipped_spaces():
        raise SpecError.single(("space",), f"the table tabulates space {table.space!r}, which is no shipped space",
                               f"give its space file as `space` ({', '.join(shipped_spaces())} are shipped)",
                               table.file)
    try:
        space = load_space(source or table.space)
    except SpecError:
        raise SpecError.single(("space",), f"with a table, the table's space ({table.space}) is the space",
                               hint, source) from None
    if space.name != table.space:
        raise SpecError.single(("space",), f"with a table, the table's space ({table.space}) is the space, not "
                               f"{space.name!r}", hint, source)
    mask_groups(params, mask_depths(space))
    return space


def als_at(row: dict, steps: int) -> dict[str, list[float]]:
    """The row's ALS per layer (``"stage.layer"`` -> per head) at the last curve step ``<= steps`` (the proxy's
    length; the first step if every step is later).

    Raises:
        SpecError: the row holds no ALS (a table of a design space, or written before ALS was recorded).
    """
    als = row.get("als")
    if not als:
        raise SpecError.single(("oracle",), "the table's rows hold no ALS", "a table of a kind: masks space")
    return _entry_at(als, steps)


def _entry_at(entries: list, steps: int):
    """The value of ``[[step, value], ...]`` at the last step ``<= steps`` (the first entry's if every step is
    later)."""
    earlier = [entry for entry in entries if entry[0] <= steps]
    return (earlier[-1] if earlier else entries[0])[1]


def mask_geometry(space: str | SearchSpace) -> tuple[int, tuple[int, int], int]:
    """``(heads per attention layer, attention grid (rows, cols), class tokens)`` of a masks space's first point,
    from its static analysis (every point of a masks space shares them: a mask changes no shape).

    Raises:
        SpecError: ``space`` is not a shipped space or a readable space file (:func:`load_space`).
    """
    spec = _first_spec(space)
    layer = next(row for row in analyze(spec).rows if row.heads)  # heads: one letter a head ('A A A')
    grid = (int(layer.grid[0]), int(layer.grid[1]))
    return len(layer.heads.split()), grid, layer.tokens - grid[0] * grid[1]


@dataclass
class AlsReplay:
    """One replay of MaiT's rule: the point it returns (``counts``: masked heads per group parameter), the rounds
    (point trained, table seed that answered it, decisions), and the simulated training seconds it cost."""

    counts: dict[str, int]
    rounds: list[dict] = field(default_factory=list)
    seconds: float = 0.0
    answered: dict[str, int] = field(default_factory=dict)  # architecture key -> the table seed that answered it


def replay_als(table, replay_seed: int, steps: int, *, heads: int, grid: tuple[int, int],
               window: tuple[int, int] = (3, 3), num_prefix_tokens: int = 1, high: float = DEFAULT_ALS_HIGH,
               low: float = DEFAULT_ALS_LOW, rounds: int = 2, normalise: bool = True,
               depths: dict[int, int] | None = None) -> AlsReplay:
    """``strategy="als"`` on a mask table (module docstring): rounds of MaiT's rule, each round's training the row
    of the table seed ``table.seed_of(key, replay_seed)`` at proxy length ``steps``.

    Args:
        table: an :class:`archspec.search._tabulation.oracle.OracleTable` of a per-group masks space.
        heads: heads per attention layer (``H``: "mask every head" is ``m = H``).
        grid, window, num_prefix_tokens: the attention grid, the mask window and the class tokens (for ``u``).
        high, low, rounds, normalise: as :class:`~archspec.search.MaskConfig`'s ``als_high``, ``als_low``,
            ``rounds`` and ``normalise``.
        depths: ``{stage: depth}`` (:func:`mask_depths`), for a space whose count covers a whole stage.

    Raises:
        SpecError: a point the rule reaches is not in the table (with every reference seed), or the table is not
            a per-group masks table.
    """
    by_params = {_signature(next(iter(rows.values()))["params"]): key for key, rows in table.rows.items()
                 if key in table.tabulated}
    first = next(iter(table.rows.values()))
    groups = mask_groups(next(iter(first.values()))["params"], depths)
    u = uniform_als(grid, window, num_prefix_tokens)
    counts = {name: 1 for name in groups}  # MaiT sec. 4.2 step 1: head 0 of every layer
    out = AlsReplay(counts=dict(counts))
    for r in range(1, rounds + 1):
        key = by_params.get(_signature(counts))
        if key is None:
            raise SpecError.single(("oracle",), f"the table lacks the point {counts} (round {r} of the rule)",
                                   "finish the table (archspec table SPACE)", table.file)
        seed = table.seed_of(key, replay_seed)
        row = table.rows[key][seed]
        out.answered[key] = seed
        out.seconds += table.training_seconds(key, steps)  # the design's cost, whichever seed answered
        scores = group_als(als_at(row, steps), groups, u if normalise else 0.0)
        flags = {name: [h < m for h in range(heads)] for name, m in counts.items()}
        if r == 1:
            new_flags, decisions = assign_from_als(flags, scores, high, low)
        else:
            new_flags, decisions = calibrate(flags, scores, low)
        new = {name: sum(f) for name, f in new_flags.items()}
        out.rounds.append({"round": r, "point": dict(counts), "key": key, "seed": seed, "als": scores,
                           "decisions": decisions, "next": dict(new)})
        changed, counts = new != counts, new
        if r >= 2 and not changed:
            break
    out.counts = counts
    return out


def group_als(als: dict[str, list[float]], groups: dict[str, tuple[int, list[int]]],
              u: float) -> dict[str, list[float]]:
    """Per group, head by head: the mean ALS of its layers, above uniform attention ``(ALS - u) / (1 - u)``
    clipped to [0, 1] (``u = 0``: the raw ALS).  Raises KeyError: a group's layer missing from ``als``."""
    out = {}
    for name, (stage, layers) in groups.items():
        per_layer = [als[f"{stage}.{layer}"] for layer in layers]
        mean = [sum(values) / len(values) for values in zip(*per_layer)]
        out[name] = [min(max((v - u) / (1.0 - u), 0.0), 1.0) for v in mean]
    return out


def shipped_spaces() -> list[str]:
    """The names of the shipped spaces (``levit_small``, ``mait_small``, ...).  Raises nothing."""
    return sorted(path.stem for path in SPACES_DIR.glob("*.yaml"))


def _signature(params: dict[str, Any] | Sequence) -> tuple:
    return tuple(sorted(dict(params).items()))


def replay_soft(table, replay_seed: int, steps: int, *, threshold: float = 0.5,
                depths: dict[int, int] | None = None) -> AlsReplay:
    """``strategy="soft"`` on a mask table (MaiT sec. 4.3): its one training, the soft-mask model with every head
    soft-masked, is the table's soft-mask row (:attr:`OracleTable.soft_rows`) of the seed drawn for this replay
    (``table.seed_of``, as every design's); each head whose learned alpha at the last curve step ``<= steps`` is
    below ``threshold`` gets a hard mask.  A table point is per group, so this replay decides per group on the
    mean alpha of its layers, head by head (as :func:`replay_als` reads ALS; a head without an alpha stays
    global): the group's count is its heads below ``threshold`` (the space masks heads 0..m-1 and heads are
    exchangeable, so a count is the placement).  Its cost is the soft model's training seconds to ``steps``.
    ``depths`` as :func:`replay_als`'s.

    Raises:
        SpecError: the table has no soft-mask rows for every reference seed, a row lacks a group's layer, or the
            table is not a per-group masks table.
    """
    soft = table.soft_rows
    if not soft or not set(table.seeds) <= set(soft):
        raise SpecError.single(("oracle",), f"the table has no soft-mask rows for seeds {table.seeds} (has "
                               f"{sorted(soft)}): the soft strategy reads the model it trains, every head soft-masked",
                               f"a {Path(table.file).stem}.soft.jsonl beside the table (bench/soft_rows.py)",
                               table.file)
    key = next(iter(soft.values()))["key"]
    seed = table.seed_of(key, replay_seed)
    groups = mask_groups(next(iter(next(iter(table.rows.values())).values()))["params"], depths)
    alphas = _entry_at(soft[seed]["alphas"], steps)
    means, counts = {}, {}
    for name, (stage, layers) in groups.items():
        missing = [f"{stage}.{layer}" for layer in layers if f"{stage}.{layer}" not in alphas]
        if missing:
            raise SpecError.single(("oracle",), f"the soft-mask row of seed {seed} has no alphas for layers {missing}",
                                   "soft-mask rows of this table's model (bench/soft_rows.py)", table.file)
        per_layer = [alphas[f"{stage}.{layer}"] for layer in layers]
        means[name] = [None if None in values else sum(values) / len(values) for values in zip(*per_layer)]
        counts[name] = sum(1 for a in means[name] if a is not None and a < threshold)
    seconds = linear_at(design_seconds(soft.values()), steps)
    return AlsReplay(counts=counts, seconds=seconds, rounds=[
        {"round": 1, "point": "every head soft-masked", "key": key, "seed": seed, "alphas": means,
         "decisions": {name: f"alphas {_fmt(means[name])} < {threshold:g}: {counts[name]} masked" for name in groups},
         "next": dict(counts)}])


def _fmt(values: list[float | None]) -> str:
    return "[" + ", ".join("-" if v is None else f"{v:.2f}" for v in values) + "]"


def table_replay_report(table, replay_seed: int, steps: int, *, strategy: str = "als", window: str = "3x3",
                        high: float | None = None, low: float | None = None, rounds: int = 2, normalise: bool = True,
                        alpha_threshold: float = 0.5, space: str | SearchSpace | None = None) -> dict[str, Any]:
    """``archspec search masks --oracle TABLE --strategy als`` (or ``soft``): :func:`replay_als` with the geometry
    of the table's space (heads, attention grid, class tokens from its first point's static analysis; ``space``:
    its name or file, default the table's own, :func:`mask_table_space`), or :func:`replay_soft` at
    ``alpha_threshold``; the returned point's reference top-1 on the seeds that did not answer it (every reference
    seed where the strategy never trained the point, as soft never does), the named fixed schemes' (mean of every
    reference seed) beside it, and a text report (``"text"``).  Accuracies in 0..1, seconds of simulated training.

    What the table cannot answer is refused as live placement refuses it (thresholds, window), and so is a window
    other than the one its ALS and soft masks were trained with (the sidecar's ``protocol.als.window``).

    Raises:
        SpecError: as :func:`replay_als` / :func:`replay_soft` / :func:`mask_table_space`; thresholds live placement
            refuses (:func:`~archspec.search._space.mask_placement.rule_thresholds`); a window that is not ``RxC``
            with odd sides, or not the table's; rows whose ALS lacks a layer of the space or has another head count.
    """
    space = space if isinstance(space, SearchSpace) else mask_table_space(table, space)
    high, low = rule_thresholds(high, low, alpha_threshold)
    win = parse_window(window, "window")
    _check_window(table, window, strategy)
    depths = mask_depths(space)
    if strategy == "soft":
        replay = replay_soft(table, replay_seed, steps, threshold=alpha_threshold, depths=depths)
        header = (f"MaiT's soft masks (--strategy soft) on the table {table.space} ({Path(table.file).name}): "
                  f"replay seed {replay_seed}, learned alphas at the last curve step <= {steps}")
    else:
        heads, grid, prefix = mask_geometry(space)
        check_als_rows(table, mask_groups(next(iter(next(iter(table.rows.values())).values()))["params"], depths),
                       heads)
        replay = replay_als(table, replay_seed, steps, heads=heads, grid=grid, window=win, num_prefix_tokens=prefix,
                            high=high, low=low, rounds=rounds, normalise=normalise, depths=depths)
        header = (f"MaiT's rule (--strategy als) on the table {table.space} ({Path(table.file).name}): replay seed "
                  f"{replay_seed}, ALS at the last curve step <= {steps}, each round's training one row")
    return _report(table, replay, replay_seed, steps, header)


def _check_window(table, window: str, strategy: str) -> None:
    """Refuse a ``window`` that is not the one the table's ALS was measured with (and its soft masks trained with:
    bench/soft_rows.py reads the same field), where its sidecar names one (``protocol.als.window``)."""
    als = table.meta.get("protocol", {}).get("als")
    tabulated = als.get("window") if isinstance(als, dict) else None
    if tabulated is None or parse_window(str(tabulated), "oracle") == parse_window(window, "window"):
        return
    what = "soft masks were trained" if strategy == "soft" else "ALS was measured"
    raise SpecError.single(("window",), f"the table's {what} with {tabulated} windows (its protocol's als.window), "
                           f"not {window}", f"leave `window` out, or tabulate with als window {window}", table.file)


def check_als_rows(table, groups: dict[str, tuple[int, list[int]]], heads: int) -> None:
    """Every row of ``table`` holds the ALS :func:`replay_als` reads: each layer of each group (``groups``:
    :func:`mask_groups`) with ``heads`` values (the rows' own shape, same layers and heads at every step, is
    :func:`archspec.search._tabulation.checks.als_problem`'s).

    Raises:
        SpecError: at ``oracle``, naming the table, the row's line and the field: no ALS, a missing layer, another
            head count.
    """
    wanted = [f"{stage}.{layer}" for stage, layers in groups.values() for layer in layers]
    for key, by_seed in table.rows.items():
        for seed, row in by_seed.items():
            line = table.lines.get((key, seed))
            where = f"line {line}: " if line is not None else ""
            layers = row["als"][0][1] if row.get("als") else None
            problem = None
            if layers is None:
                problem = "field als: the row holds no ALS (a mask table's rows record it at every curve step)"
            elif missing := [name for name in wanted if name not in layers]:
                problem = f"field als[0]: no ALS of layer {missing[0]} (the space's layers: {', '.join(wanted)})"
            elif len(values := layers[wanted[0]]) != heads:
                problem = f"field als[0].{wanted[0]}: {len(values)} heads, where the space's layers have {heads}"
            if problem:
                raise SpecError.single(("oracle",), where + problem, "rows of this table's space (archspec table)",
                                       table.file)


def _report(table, replay: AlsReplay, replay_seed: int, steps: int, header: str) -> dict[str, Any]:
    """:func:`table_replay_report`'s scoring and text for a finished replay."""
    key = {_signature(next(iter(rows.values()))["params"]): k for k, rows in table.rows.items()}.get(
        _signature(replay.counts))
    seeds = table.seeds
    held_out = [s for s in seeds if s != replay.answered.get(key)]
    reference = (sum(table.rows[key][s]["final_accuracy"] for s in held_out) / len(held_out)
                 if key in table.tabulated else None)
    fixed = {}
    for k in table.tabulated:
        first = table.rows[k][seeds[0]]
        if first.get("hand"):
            fixed[first["hand"]] = sum(table.rows[k][s]["final_accuracy"] for s in seeds) / len(seeds)
    label = " ".join(f"{name.rsplit('.', 1)[-1]}={m}" for name, m in sorted(replay.counts.items()))
    lines = [header]
    for r in replay.rounds:
        point = (r["point"] if isinstance(r["point"], str)
                 else " ".join(f"{n.rsplit('.', 1)[-1]}={m}" for n, m in sorted(r["point"].items())))
        lines.append(f"  round {r['round']}: trained {point} (table seed {r['seed']})")
        lines.extend(f"    {name.rsplit('.', 1)[-1]}: {text}" for name, text in sorted(r["decisions"].items()))
    shown = "not tabulated" if reference is None else f"{reference:.4f} (seeds {held_out})"
    lines.append(f"placement: {label}; reference top-1 {shown}; {replay.seconds:.0f} s of training simulated")
    if fixed:
        lines.append("fixed schemes (mean of seeds " + ", ".join(map(str, seeds)) + "): "
                     + ", ".join(f"{name} {acc:.4f}" for name, acc in sorted(fixed.items())))
    return {"space": table.space, "replay_seed": replay_seed, "steps": steps, "placement": replay.counts,
            "reference_accuracy": reference, "reference_seeds": held_out, "simulated_seconds": replay.seconds,
            "rounds": replay.rounds, "fixed_schemes": fixed, "text": "\n".join(lines)}
