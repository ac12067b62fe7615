"""``archspec table`` (issue 52): workers on one Optuna storage share the pairs, a killed worker's pair is trained
again, a protocol mismatch is refused before anything is written, export writes exactly the study's rows, and the
shipped levit_small table goes through the study byte for byte.

The workers are real processes on a journal file; their training is a stand-in that sleeps and returns a fixed
row (what is tested is who trains which pair, not the training: that is tests/test_search_table.py's)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import optuna
import pytest
from search_fixtures import tiny_masks_space

import archspec
from archspec.errors import SpecError
from archspec.search._space.language import load_space
from archspec.search._tabulation.exchange import _reference_seeds, export_table, import_table, study_rows
from archspec.search._tabulation.oracle import TABLES_DIR, load_table
from archspec.search._tabulation.tabulate import ordered_points, protocol_id, table_protocol, tabulate

ROOT = Path(__file__).resolve().parent.parent
SEEDS, DESIGNS = (0, 1), 3

WORKER = textwrap.dedent("""
    import sys, time
    from archspec.search._space.language import load_space
    from archspec.search._tabulation.tabulate import table_protocol, tabulate

    storage, delay, block_first = sys.argv[1], float(sys.argv[2]), sys.argv[3] == "1"
    space = load_space("mait_small")
    calls = []

    def train(spec, seed):
        calls.append(seed)
        if block_first and len(calls) == 1:
            open(storage.split(":", 1)[1] + ".training", "w").close()  # past its last write before training
            time.sleep(600)
        time.sleep(delay)
        return {"zc": {"naswot": 1.0}, "zc_seconds": {"naswot": 0.0}, "curve": [[10, 0.5, 1.0], [20, 0.6, 0.9]],
                "tse": [[10, 5.0, 0.1], [20, 9.0, 0.2]], "final_accuracy": 0.6 + seed / 100, "final_val_loss": 0.9,
                "train_seconds": 0.2, "eval_seconds": 0.0}

    protocol = table_protocol(space, steps=20, curve_steps=[10, 20], warmup_steps=2)
    tabulate(space, seeds=(0, 1), designs=3, storage=storage, protocol=protocol, train=train, log=lambda s: None)
""")


@pytest.fixture(scope="module")
def space():
    return load_space("mait_small")


@pytest.fixture(scope="module")
def protocol(space):
    return table_protocol(space, steps=20, curve_steps=[10, 20], warmup_steps=2)


def _worker(storage: str, delay: float = 0.05, block_first: bool = False) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", WORKER, storage, str(delay), "1" if block_first else "0"],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _trials(storage: str):
    study = optuna.load_study(study_name="table.mait_small", storage=_storage(storage))
    return study.get_trials(deepcopy=False)


def _storage(url: str):
    from archspec.search._storage import resolve_storage

    return resolve_storage(url).storage


def _wanted(space) -> set:
    from archspec.search._evaluation.latency import architecture_key

    return {(architecture_key(spec), s) for _, _, spec in ordered_points(space)[:DESIGNS] for s in SEEDS}


def _trained(trials) -> list:
    done = optuna.trial.TrialState.COMPLETE
    return [(t.user_attrs["key"], t.user_attrs["seed"]) for t in trials if t.state == done]


@pytest.mark.slow  # real worker processes (a few seconds of imports each)
def test_two_workers_on_one_storage_never_train_the_same_pair(tmp_path, space):
    url = f"journal:{tmp_path / 't.journal'}"
    workers = [_worker(url, delay=0.3) for _ in range(2)]
    for w in workers:
        assert w.wait(timeout=180) == 0, w.stderr.read()
    trials = _trials(url)
    trained = _trained(trials)
    assert sorted(trained) == sorted(_wanted(space))  # every pair once, none twice
    pids = {t.user_attrs["worker"]["pid"] for t in trials if t.state == optuna.trial.TrialState.COMPLETE}
    assert len(pids) == 2  # both took pairs (6 pairs of 0.3 s against one process's start-up)


@pytest.mark.slow  # real worker processes (a few seconds of imports each)
def test_a_worker_killed_mid_pair_loses_only_that_pair_and_another_retrains_it(tmp_path, space):
    url = f"journal:{tmp_path / 't.journal'}"
    victim = _worker(url, block_first=True)
    deadline = time.monotonic() + 120
    # Wait until it trains its first pair, signalled by the stand-in itself: a trial seen "training" in the
    # journal is not enough, as the worker still writes the pair's parameters after that, and a kill inside
    # that write leaves Optuna's journal lock behind for its 30 s grace period (the test took 2 s or 32 s).
    while not (tmp_path / "t.journal.training").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    running = [t for t in _trials(url) if t.state == optuna.trial.TrialState.RUNNING
               and t.user_attrs.get("status") == "training"]
    assert len(running) == 1, "the worker never started training"
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait()
    survivor = _worker(url)
    assert survivor.wait(timeout=180) == 0, survivor.stderr.read()
    trials = _trials(url)
    assert sorted(_trained(trials)) == sorted(_wanted(space))
    killed = [t for t in trials if t.number == running[0].number][0]
    assert killed.state == optuna.trial.TrialState.FAIL and "died" in killed.user_attrs["fail_reason"]
    rows = study_rows(space, url, table_protocol(space, steps=20, curve_steps=[10, 20], warmup_steps=2))
    assert sorted((r["key"], r["seed"]) for r in rows) == sorted(_wanted(space))


def _fake(spec, seed):
    return {"zc": {"naswot": 1.0}, "zc_seconds": {}, "curve": [[10, 0.5, 1.0], [20, 0.6, 0.9]],
            "tse": [[10, 5.0, 0.1], [20, 9.0, 0.2]], "final_accuracy": 0.6, "final_val_loss": 0.9,
            "train_seconds": 0.2, "eval_seconds": 0.0}


def test_a_protocol_mismatch_is_refused_before_anything_is_written(tmp_path, space, protocol):
    url = f"journal:{tmp_path / 't.journal'}"
    tabulate(space, seeds=(0,), designs=1, storage=url, protocol=protocol, train=_fake, log=lambda s: None)
    before = (tmp_path / "t.journal").read_bytes()
    other = table_protocol(space, steps=40, curve_steps=[10, 40], warmup_steps=2)
    with pytest.raises(SpecError, match=r"another protocol \(fields curve_steps, steps differ"):
        tabulate(space, seeds=(0, 1), designs=2, storage=url, protocol=other, train=_fake, log=lambda s: None)
    assert (tmp_path / "t.journal").read_bytes() == before


@pytest.mark.slow  # reads Fashion-MNIST before it compares the protocols (about 1 s beside the imports)
def test_the_cli_refuses_a_mismatch_with_exit_2_naming_the_fields(tmp_path, space, protocol, capsys):
    """``archspec table`` refuses before it starts a worker (in this process since issue 53: the fresh interpreter
    cost 7 s of imports and checked nothing the CLI's own entry point does not)."""
    from archspec.cli import main

    url = f"journal:{tmp_path / 't.journal'}"
    tabulate(space, seeds=(0,), designs=1, storage=url, protocol=protocol, train=_fake, log=lambda s: None)
    before = (tmp_path / "t.journal").read_bytes()
    code = main(["table", "mait_small", "--storage", url, "--designs", "1", "--steps", "30", "--curve-steps", "10",
                 "30"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert "steps 20 there, 30 here" in err and str(tmp_path) in err
    assert (tmp_path / "t.journal").read_bytes() == before


def test_export_writes_exactly_the_rows_of_the_study_and_the_oracle_reads_them(tmp_path, space, protocol):
    url = f"journal:{tmp_path / 't.journal'}"
    tabulate(space, seeds=SEEDS, designs=DESIGNS, storage=url, protocol=protocol, train=_fake, log=lambda s: None)
    path, n = export_table(space, tmp_path / "m.jsonl", storage=url, protocol=protocol)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert n == len(rows) == DESIGNS * len(SEEDS) and rows == study_rows(space, url, protocol)
    assert {r["protocol_id"] for r in rows} == {protocol_id(protocol)}
    meta = json.loads(path.with_suffix(".meta.json").read_text())
    # the seeds the designs were trained with (0 and 1), not the default three: with [0, 1, 2] the oracle would
    # answer for none of them
    assert meta["protocol"] == protocol and meta["reference_seeds"] == list(SEEDS)
    table = load_table(path)
    assert len(table.rows) == DESIGNS and table.meta["protocol_id"] == protocol_id(protocol)
    assert len(table.tabulated) == DESIGNS


def test_export_without_a_seed_common_to_every_design_asks_for_the_reference_seeds(tmp_path, space, protocol):
    """Two designs trained with disjoint seeds: no seed answers for both, so the sidecar's rule refuses (path
    ``seeds``, which the CLI names ``--seeds``); named seeds, or the replaced sidecar's, are taken as they are."""
    url = f"journal:{tmp_path / 't.journal'}"
    tabulate(space, seeds=(0,), designs=1, storage=url, protocol=protocol, train=_fake, log=lambda s: None)
    rows = study_rows(space, url, protocol)
    other = [{**row, "key": "another", "seed": 1} for row in rows]
    with pytest.raises(SpecError, match="no seed is trained for every design") as info:
        _reference_seeds(rows + other, None, {})
    assert info.value.problems[0].path == ("seeds",)
    assert _reference_seeds(rows + other, [1], {}) == [1]
    assert _reference_seeds(rows, None, {"reference_seeds": [4]}) == [4]


def test_export_never_overwrites_a_file_archspec_did_not_write(tmp_path, space, protocol):
    url = f"journal:{tmp_path / 't.journal'}"
    tabulate(space, seeds=(0,), designs=1, storage=url, protocol=protocol, train=_fake, log=lambda s: None)
    mine = tmp_path / "notes.jsonl"
    mine.write_text("my own notes\n")
    with pytest.raises(SpecError, match="not a table of this protocol"):
        export_table(space, mine, storage=url, protocol=protocol)
    assert mine.read_text() == "my own notes\n"


@pytest.mark.slow  # 1.5-3.4 s in the quick subset (docs/contributing.md: over a second is slow)
def test_the_shipped_levit_small_table_goes_through_a_study_byte_for_byte(tmp_path):
    shipped = TABLES_DIR / "levit_small.jsonl"
    copy = tmp_path / "in" / "levit_small.jsonl"
    copy.parent.mkdir()
    copy.write_bytes(shipped.read_bytes())
    (copy.with_suffix(".meta.json")).write_bytes(shipped.with_suffix(".meta.json").read_bytes())
    url = f"journal:{tmp_path / 'l.journal'}"
    space = load_space("levit_small")
    protocol = table_protocol(space)
    assert protocol_id(protocol) == json.loads(shipped.with_suffix(".meta.json").read_text())["protocol_id"]
    assert import_table(space, copy, storage=url) == len(copy.read_text().splitlines())
    assert import_table(space, copy, storage=url) == 0  # once only
    path, _ = export_table(space, tmp_path / "out" / "levit_small.jsonl", storage=url)
    assert path.read_bytes() == copy.read_bytes()


def test_the_seed_check_order_is_a_random_draw_then_the_named_points(space):
    order = ordered_points(space)
    assert len(order) == 64 == len({tuple(p.items()) for _, p, _ in order})
    named = {(0, 0, 0), (3, 3, 3), (1, 1, 1), (2, 1, 0)}  # none, every head, Sch.1-like, Sch.2-like
    head = {tuple(p.values()) for _, p, _ in order[:24]}
    after = [tuple(p.values()) for _, p, _ in order[24:24 + len(named - head)]]
    assert set(after) == named - head  # the named points the random draw missed come right after it


def test_the_grid14_pilot_is_mait_smalls_placements_at_patch_2_with_macs_by_hand():
    """research/pilots/mait_grid14.yaml (research/search-works-notebook.md's next pilot): the same 64 placements in the
    same order as mait_small, every point one model of 197 tokens (14x14 + class) at width 48.  MACs by hand, per layer:
    qkv 3 N C^2 + QK^T N^2 C + AV N^2 C + proj N C^2 + MLP 8 N C^2 (N 197, C 48) = 9,172,320, six layers 55,033,920,
    plus the patch embedding 196 x 48 x 4 and the classifier 48 x 10: 55,072,032."""
    pilot = load_space(ROOT / "research" / "pilots" / "mait_grid14.yaml")
    points = list(pilot.points())
    assert [p for p, _ in points] == [p for p, _ in load_space("mait_small").points()]
    n, c = 14 * 14 + 1, 48
    per_layer = 3 * n * c * c + 2 * n * n * c + n * c * c + 8 * n * c * c
    want = 6 * per_layer + 196 * c * 4 + c * 10
    assert want == 55_072_032
    for _, spec in (points[0], points[-1]):  # no masks, every head masked: a mask adds no MACs
        assert archspec.analyze(spec).macs == want


def test_the_nopos_pilot_is_mait_smalls_placements_without_the_position_embedding_by_hand():
    """research/pilots/mait_nopos.yaml (research/search-works-notebook.md, "No position embedding"): the same 64
    placements in the same order as mait_small, every point mait_small's model less its learned position embedding -- 50
    tokens (7x7 + class) x width 96 = 4,800 parameters fewer, the same MACs (adding the embedding is no
    multiply-accumulate) -- so the protocol's rows differ from mait_small's only by where position can enter."""
    pilot = load_space(ROOT / "research" / "pilots" / "mait_nopos.yaml")
    points, base = list(pilot.points()), list(load_space("mait_small").points())
    assert [p for p, _ in points] == [p for p, _ in base]
    for (_, spec), (_, ref) in ((points[0], base[0]), (points[-1], base[-1])):
        assert spec.tokens.pos_embed == "none"
        ours, theirs = archspec.analyze(spec), archspec.analyze(ref)
        assert (ours.macs, ours.params) == (theirs.macs, theirs.params - (7 * 7 + 1) * 96)


def test_the_conv_stem_probe_is_the_nopos_pilot_behind_levits_conv_stem_by_hand():
    """research/pilots/mait_nopos_conv.yaml (research/search-works-notebook.md, "A conv stem"): the nopos pilot's 64
    placements in the same order behind LeViT's conv stem (3x3 stride-2 convs 1 -> 48 -> 96, no conv bias, BatchNorm
    after each) instead of the 4x4 patch embedding (16 x 96 weights + 96 biases).  By hand: parameters 9 x 48 + 2 x 48 +
    9 x 48 x 96 + 2 x 96 - (16 x 96 + 96) = 40,560 more; MACs 14 x 14 x 48 x 9 (conv 1) + 7 x 7 x 96 x 48 x 9 (conv 2) -
    7 x 7 x 96 x 16 (the patch embedding) = 2,041,536 more."""
    probe = list(load_space(ROOT / "research" / "pilots" / "mait_nopos_conv.yaml").points())
    base = list(load_space(ROOT / "research" / "pilots" / "mait_nopos.yaml").points())
    assert [p for p, _ in probe] == [p for p, _ in base]
    for (_, spec), (_, ref) in ((probe[0], base[0]), (probe[-1], base[-1])):
        assert (spec.stem.kind, spec.tokens.pos_embed) == ("conv", "none")
        ours, theirs = archspec.analyze(spec), archspec.analyze(ref)
        assert ours.params - theirs.params == 9 * 48 + 2 * 48 + 9 * 48 * 96 + 2 * 96 - (16 * 96 + 96) == 40_560
        assert ours.macs - theirs.macs == 14 * 14 * 48 * 9 + 7 * 7 * 96 * 48 * 9 - 7 * 7 * 96 * 16 == 2_041_536


def test_the_cli_exports_and_reports_what_the_study_holds(tmp_path, space, protocol, capsys):
    """``archspec table --export`` writes the study's rows (exit 0, a line saying how many) and ``--report`` prints
    the seed check of the same rows (two seeds of three points: single-seed tau over 3 designs)."""
    from archspec.cli import main

    url = f"journal:{tmp_path / 't.journal'}"

    def train(spec, seed):  # points differ by accuracy, both seeds agree on the order
        return {**_fake(spec, seed), "final_accuracy": 0.5 + len(str(spec.stages[0].layers)) / 1e4 + seed / 1e3}

    tabulate(space, seeds=SEEDS, designs=DESIGNS, storage=url, protocol=protocol, train=train, log=lambda s: None)
    flags = ["--storage", url, "--steps", "20", "--curve-steps", "10", "20", "--warmup-steps", "2"]
    assert main(["table", "mait_small", *flags, "--export", str(tmp_path / "m.jsonl")]) == 0
    assert f"wrote {DESIGNS * len(SEEDS)} rows" in capsys.readouterr().out
    assert json.loads((tmp_path / "m.meta.json").read_text())["reference_seeds"] == [0, 1]
    # --seeds with --export names the reference: seed 0 alone (a single-seed table of the same rows)
    assert main(["table", "mait_small", *flags, "--seeds", "0", "--export", str(tmp_path / "m0.jsonl")]) == 0
    assert json.loads((tmp_path / "m0.meta.json").read_text())["reference_seeds"] == [0]
    capsys.readouterr()
    assert main(["table", "mait_small", *flags, "--report"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["designs"] == DESIGNS and -1 <= report["tau"] <= 1
    assert main(["table", "mait_small", *flags, "--report", "--export", "x.jsonl"]) == 2  # one step at a time


def test_import_of_a_file_that_is_not_a_table_names_import_and_writes_nothing(tmp_path, capsys):
    """The loader is shared with --oracle; refused at --import, the message names --import, and no storage is made."""
    from archspec.cli import main

    bad = tmp_path / "notes.jsonl"
    bad.write_text('{"a": 1}\n')
    journal = tmp_path / "t.journal"
    assert main(["table", "mait_small", "--import", str(bad), "--storage", f"journal:{journal}"]) == 2
    err = capsys.readouterr().err
    assert "--import: line 1: not a table row" in err and "--oracle" not in err and not journal.exists()


@pytest.mark.slow
def test_import_takes_a_shipped_tables_name_as_load_table_does(tmp_path, capsys):
    """``--import levit_small`` (a shipped table's name, as ``--oracle`` takes it) read the name as a path: a
    FileNotFoundError traceback after the loader had accepted it.  Every row of the shipped table goes in."""
    from archspec.cli import main

    journal = tmp_path / "t.journal"
    assert main(["table", "levit_small", "--import", "levit_small", "--storage", f"journal:{journal}"]) == 0
    rows = sum(len(seeds) for seeds in load_table("levit_small").rows.values())
    assert f"imported {rows} rows of levit_small" in capsys.readouterr().out


def test_a_diverged_pair_stores_its_reason_under_the_name_stored_before_the_rename(tmp_path, space, protocol):
    """The training loop's ``TrainingFailure`` was ``TrialFailure`` (issue 58 renamed it): a failed pair's stored
    ``fail_reason`` and its log line still say ``TrialFailure``, so studies written before and after read alike."""
    from archspec.train.failures import TrainingFailure

    def train(spec, seed):
        raise TrainingFailure("loss became nan at step 3")

    url, lines = f"journal:{tmp_path / 't.journal'}", []
    tabulate(space, seeds=(0,), designs=1, storage=url, protocol=protocol, train=train, log=lines.append)
    failed = [t for t in _trials(url) if t.state == optuna.trial.TrialState.FAIL]
    assert failed and {t.user_attrs["fail_reason"] for t in failed} == {"TrialFailure: loss became nan at step 3"}
    assert any(line.endswith("failed (TrialFailure: loss became nan at step 3)") for line in lines), lines


def test_a_progress_line_counts_the_pairs_other_workers_finished_meanwhile(tmp_path, space, protocol):
    """Worker B claims a pair; while it trains, worker A (run inside B's stand-in, so the order is fixed) takes and
    finishes another. 6 pairs wanted: A's line is [1/6] with 5 left; B's, after its own, is [2/6] with 4 left --
    two done in the storage, where counting down its own look would print [1/6] again."""
    url = f"journal:{tmp_path / 't.journal'}"
    lines_a, lines_b = [], []

    def train_b(spec, seed):
        tabulate(space, seeds=SEEDS, designs=DESIGNS, storage=url, protocol=protocol, max_pairs=1, train=_fake,
                 log=lines_a.append)
        return _fake(spec, seed)

    progress = tabulate(space, seeds=SEEDS, designs=DESIGNS, storage=url, protocol=protocol, max_pairs=1,
                        train=train_b, log=lines_b.append)
    assert lines_a[-1].startswith("[1/6]") and "; 5 left," in lines_a[-1]
    assert lines_b[-1].startswith("[2/6]") and "; 4 left," in lines_b[-1]
    assert (progress.trained, progress.left) == (1, 4)


def test_the_eta_reads_the_median_pair_so_one_stopped_pair_does_not_swell_it():
    """Pairs of 400, 6,100 (its worker stopped for an hour) and 320 s; 20 left on 2 workers: the median 400 s ->
    20 x 400 / 2 = 4,000 s (the mean, 2,273 s a pair, would say 22,733 s)."""
    from archspec.search._tabulation.tabulate import TableProgress

    progress = TableProgress(wanted=36, left=20, seconds=[400.0, 6100.0, 320.0])
    assert progress.eta_s(2) == pytest.approx(4000.0)
    assert TableProgress(wanted=1).eta_s(1) is None


def test_a_spaces_own_protocol_fields_come_between_the_reference_and_the_flags():
    """mait_small.yaml's ``protocol:`` (1,876 steps, 94 warm-up, its curve) replaces those reference fields and keeps
    the others; a caller's override wins over both.  By hand against REFERENCE_PROTOCOL."""
    from archspec.search._tabulation.tabulate import REFERENCE_PROTOCOL

    protocol = table_protocol(load_space("mait_small"))
    assert (protocol["steps"], protocol["warmup_steps"]) == (1876, 94)
    assert protocol["curve_steps"] == [25, 50, 100, 200, 400, 800, 1600, 1876]
    assert {k: v for k, v in protocol.items() if k not in ("space", "als", "steps", "warmup_steps", "curve_steps")} \
        == {k: v for k, v in REFERENCE_PROTOCOL.items() if k not in ("steps", "warmup_steps", "curve_steps")}
    assert table_protocol(load_space("levit_small"))["steps"] == REFERENCE_PROTOCOL["steps"] == 938  # none given
    assert table_protocol(load_space("mait_small"), steps=20, curve_steps=[10, 20])["steps"] == 20


@pytest.mark.parametrize(("protocol", "field", "message"), [
    ("{stepz: 100}", "protocol.stepz", "unknown protocol field 'stepz'"),
    ("{steps: 100}", "protocol.curve_steps", "must be increasing positive step numbers ending at steps (100)"),
    ("[100]", "protocol", "protocol must be a mapping of table-protocol fields"),
    # issue 80: a field of the wrong type was a TypeError traceback (data) or a failure of every pair
    ("{data: 5}", "protocol.data", "data must be a data set's name or a path (text), got 5"),
    ("{augmentation: 5}", "protocol.augmentation", "augmentation must be one of none, flip, crop, flip+crop, got 5"),
    ("{optimizer: 5}", "protocol.optimizer", "optimizer must be a timm optimizer's name (text), got 5"),
    ("{als: garbage}", "protocol.als", "als must be a mapping {window: RxC, images: N}, got 'garbage'"),
    ("{als: {window: 2x2, images: 128}}", "protocol.als.window", "window 2x2 has an even side"),
    ("{als: {window: 3x3, images: 0}}", "protocol.als.images", "als.images must be a positive integer, got 0"),
    ("{als: {window: 3x3}}", "protocol.als", "als must be a mapping {window: RxC, images: N}"),
])
def test_a_bad_protocol_in_a_space_file_is_located_there_and_writes_nothing(tmp_path, capsys, protocol, field,
                                                                              message):
    """``archspec table FILE`` with a bad ``protocol:``: exit 2, the file, the line of the protocol and the field,
    no traceback, no storage made."""
    from archspec.cli import main

    text = (TABLES_DIR.parent / "spaces" / "mait_small.yaml").read_text()
    start = text.index("protocol:\n")
    end = text.index("spec:\n", start)
    path = tmp_path / "my_space.yaml"
    path.write_text(text[:start] + f"protocol: {protocol}\n" + text[end:])
    line = text[:start].count("\n") + 1
    journal = tmp_path / "t.journal"
    assert main(["table", str(path), "--storage", f"journal:{journal}", "--designs", "1"]) == 2
    err = capsys.readouterr().err
    assert f"{path}:{line}" in err and field in err and message in err, err
    assert "Traceback" not in err and not journal.exists()


# ----------------------------------------------------------------------------------------------- issue 80
def _unwritable(directory: Path) -> bool:
    """``chattr +i`` on ``directory`` (root ignores file modes), else mode 0o555 for others; False where neither
    makes it unwritable here."""
    if subprocess.run(["chattr", "+i", str(directory)], capture_output=True).returncode == 0:
        return True
    if os.geteuid() != 0:
        directory.chmod(0o555)
        return True
    return False


def _writable_again(directory: Path) -> None:
    subprocess.run(["chattr", "-i", str(directory)], capture_output=True)
    directory.chmod(0o755)


def test_export_where_the_file_cannot_be_created_is_exit_2_naming_export(tmp_path, space, protocol, capsys):
    """Issue 80: ``--export afile/x.jsonl`` (a FileExistsError) and ``--export`` into an immutable directory (a
    PermissionError) were tracebacks; now exit 2 naming --export and the path, the file and directory untouched."""
    from archspec.cli import main

    url = f"journal:{tmp_path / 't.journal'}"
    tabulate(space, seeds=(0,), designs=1, storage=url, protocol=protocol, train=_fake, log=lambda s: None)
    flags = ["--storage", url, "--steps", "20", "--curve-steps", "10", "20", "--warmup-steps", "2"]
    afile = tmp_path / "afile"
    afile.write_text("mine\n")
    assert main(["table", "mait_small", *flags, "--export", str(afile / "x.jsonl")]) == 2
    err = capsys.readouterr().err
    assert f"{afile / 'x.jsonl'}: --export: cannot be created: {afile} is not a directory" in err, err
    assert "Traceback" not in err and afile.read_text() == "mine\n"
    locked = tmp_path / "locked"
    locked.mkdir()
    if not _unwritable(locked):
        pytest.skip("no way to make a directory unwritable here")
    try:
        assert main(["table", "mait_small", *flags, "--export", str(locked / "x.jsonl")]) == 2
        err = capsys.readouterr().err
        assert f"{locked / 'x.jsonl'}: --export:" in err and "not writable" in err and "Traceback" not in err, err
        assert list(locked.iterdir()) == []
    finally:
        _writable_again(locked)


def test_the_default_storage_where_runs_tables_cannot_be_made_is_exit_2_naming_storage(tmp_path, monkeypatch,
                                                                                       space, protocol, capsys):
    """Issue 80: the default storage (journal:runs/tables/SPACE.journal) with a file named ``runs`` in the working
    directory (NotADirectoryError) or a read-only working directory (PermissionError) was a traceback; now a
    SpecError at ``storage`` (``--storage`` on the command line), and the file ``runs`` is left as it was."""
    from archspec.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").write_text("my notes\n")
    with pytest.raises(SpecError, match=r"storage: cannot create runs/tables.*runs is not a directory"):
        tabulate(space, seeds=(0,), designs=1, protocol=protocol, train=_fake, log=lambda s: None)
    assert main(["table", "mait_small", "--import", "mait_small"]) == 2
    err = capsys.readouterr().err
    assert "--storage: cannot create runs/tables" in err and "Traceback" not in err, err
    assert (tmp_path / "runs").read_text() == "my notes\n"
    (tmp_path / "runs").unlink()
    if not _unwritable(tmp_path):
        pytest.skip("no way to make a directory unwritable here")
    try:
        with pytest.raises(SpecError, match=r"storage: cannot create runs/tables.*not writable"):
            tabulate(space, seeds=(0,), designs=1, protocol=protocol, train=_fake, log=lambda s: None)
        assert list(tmp_path.iterdir()) == []
    finally:
        _writable_again(tmp_path)


def test_a_table_in_memory_is_refused_before_anything_is_trained(tmp_path, space, protocol, capsys):
    """Issue 80: ``--storage memory`` trained every pair and lost them all when the worker ended (no export, no
    report, no other worker can see them); refused at ``storage`` before training."""
    from archspec.cli import main

    trained = []

    def train(spec, seed):
        trained.append(seed)
        return _fake(spec, seed)

    with pytest.raises(SpecError, match="storage: a table in memory is lost when this worker ends"):
        tabulate(space, seeds=(0,), designs=1, storage="memory", protocol=protocol, train=train, log=lambda s: None)
    assert trained == []
    assert main(["table", "mait_small", "--storage", "memory", "--designs", "1"]) == 2
    assert "--storage: a table in memory is lost" in capsys.readouterr().err


def test_import_refuses_rows_whose_designs_are_no_points_of_the_space(tmp_path, space, capsys):
    """Issue 80: ``--import`` took rows of designs that are no points of the space (a row's key, or its params, of
    another design); refused at --import naming the line, nothing written.  Three rows of the shipped mait_small
    table, the second with another key, then with the params of another point."""
    from archspec.cli import main

    lines = (TABLES_DIR / "mait_small.jsonl").read_text().splitlines()[:3]
    meta = (TABLES_DIR / "mait_small.meta.json").read_text()
    journal = tmp_path / "t.journal"
    second = json.loads(lines[1])["key"][:12]
    for edit, words in ((lambda r: r.update(key="0" * 64), "design 000000000000 is no point of space mait_small"),
                        (lambda r: r["params"].update({"stages.0.heads_mix.masked.0-1": 9}),
                         f"design {second}: its params are not those of the point its key names")):
        rows = [json.loads(line) for line in lines]
        edit(rows[1])
        table = tmp_path / "mine.jsonl"
        table.write_text("".join(json.dumps(r) + "\n" for r in rows))
        table.with_suffix(".meta.json").write_text(meta)
        with pytest.raises(SpecError, match=f"line 2: {words}"):
            import_table(space, table, storage=f"journal:{journal}")
        assert main(["table", "mait_small", "--import", str(table), "--storage", f"journal:{journal}"]) == 2
        err = capsys.readouterr().err
        assert f"{table}: --import: line 2: {words}" in err and not journal.exists(), err


def test_a_worker_whose_every_pair_fails_stops_says_so_and_exits_1(tmp_path, monkeypatch, space, capsys):
    """Issue 80: a worker that trained nothing (every pair failed: the input is wrong) printed its lines and exited
    0.  Now it stops after four failures with no pair trained (not every pair of the space twice) and exits 1,
    saying why; one pair trained before a failure is a worker that works (exit 0)."""
    from archspec.cli import main
    from archspec.search._tabulation import tabulate as tabulate_module

    def failing(protocol):
        def train(spec, seed):
            raise RuntimeError("Input height (16) doesn't match model (8).")
        return train

    monkeypatch.setattr(tabulate_module, "_real_trainer", lambda protocol, points: failing(protocol))
    url = f"journal:{tmp_path / 't.journal'}"
    flags = ["--storage", url, "--steps", "20", "--curve-steps", "10", "20", "--warmup-steps", "2"]
    assert main(["table", "mait_small", *flags, "--designs", "8", "--seeds", "0"]) == 1
    out = capsys.readouterr().out
    assert "trained nothing here: 4 tries, every one failed (the first: RuntimeError: Input height (16) doesn't " \
           "match model (8).); stopped" in out, out
    failed = [t for t in _trials(url) if t.state == optuna.trial.TrialState.FAIL]
    assert len(failed) == 4

    def first_only(protocol):
        calls = []

        def train(spec, seed):
            calls.append(seed)
            if len(calls) > 1:
                raise RuntimeError("diverged")
            return _fake(spec, seed)
        return train

    monkeypatch.setattr(tabulate_module, "_real_trainer", lambda protocol, points: first_only(protocol))
    other = f"journal:{tmp_path / 'u.journal'}"
    assert main(["table", "mait_small", *flags[2:], "--storage", other, "--designs", "3", "--seeds", "0"]) == 0
    assert "trained 1 pairs here (4 failed)" in capsys.readouterr().out  # 2 pairs x 2 tries


def test_the_sidecar_never_holds_a_storage_password(tmp_path, space, protocol):
    """Issue 80: the export's sidecar records the tabulating command; a PostgreSQL password in its --storage is
    written ``***`` (as SQLAlchemy hides it)."""
    url = f"journal:{tmp_path / 't.journal'}"
    tabulate(space, seeds=(0,), designs=1, storage=url, protocol=protocol, train=_fake, log=lambda s: None)
    path, _ = export_table(space, tmp_path / "m.jsonl", storage=url, protocol=protocol,
                           command="archspec table mait_small --storage postgresql://me:pw-42@db.lan/tables")
    meta = path.with_suffix(".meta.json").read_text()
    assert "pw-42" not in meta and "postgresql://me:***@db.lan/tables" in meta


TINY_MASKS = tiny_masks_space("{data: digits, image_size: IMAGE, train_images: 40, curve_val_images: 20, "
                              "final_val_images: 20, batch_size: 8, steps: 4, warmup_steps: 1, curve_steps: [2, 4], "
                              "zero_cost_batch: 8, als: {window: 3x3, images: 8}}")


@pytest.mark.slow  # decodes the embedded digits (torch's import and the decoding: about 3 s)
@pytest.mark.parametrize("image, flags, words", [
    (8, ["--train-images", "5"], "--train-images: 5 images cannot hold one of each of the 10 classes"),
    (8, ["--train-images", "100000"], "--train-images: 100000 images of 10 classes is 10000 of each; the training "
                                      "images of digits hold 139 of their smallest class"),
    (8, ["--train-images", "45"], "--train-images: 45 is not a multiple of the 10 classes"),
    (16, [], "protocol.image_size: the proxy of tiny_masks trains at 8 px, not the protocol's 16"),
])
def test_a_protocol_the_data_or_the_space_cannot_train_is_refused_before_any_pair(tmp_path, capsys, image, flags,
                                                                                   words):
    """Issue 80: ``--train-images 5`` on 10 classes (an empty subset), ``protocol: {image_size: 16}`` on an 8 px spec
    (every pair failed on a shape) were exit 0 with every pair failed; ``--train-images 100000`` on digits' 1,437
    training images recorded 100,000 in the protocol.  Now exit 2 before the study exists, naming the flag (or the
    space file's field).  Digits' smallest training class holds 139 images (np.bincount of its labels)."""
    from archspec.cli import main

    path = tmp_path / "tiny.yaml"
    path.write_text(TINY_MASKS.replace("IMAGE", str(image)))
    journal = tmp_path / "t.journal"
    assert main(["table", str(path), "--storage", f"journal:{journal}", *flags]) == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err and not journal.exists(), err
    if image == 16:
        assert f"{path}:3" in err  # the line of protocol: in the space file


@pytest.mark.slow  # decodes the embedded digits
def test_an_optimizer_timm_does_not_have_is_refused_before_any_pair(tmp_path, capsys):
    """Issue 80: ``protocol: {optimizer: adamx}`` failed every pair (timm's ValueError); refused as ``archspec train``
    refuses it, at the space file's ``protocol.optimizer``."""
    from archspec.cli import main

    path = tmp_path / "tiny.yaml"
    path.write_text(TINY_MASKS.replace("IMAGE", "8").replace("data: digits,", "data: digits, optimizer: adamx,"))
    journal = tmp_path / "t.journal"
    assert main(["table", str(path), "--storage", f"journal:{journal}"]) == 2
    err = capsys.readouterr().err
    assert f"{path}:3" in err and "protocol.optimizer: 'adamx' is not a timm optimizer" in err, err
    assert not journal.exists()
