"""`archspec build` never deletes what it did not write; replacing a build is crash-safe; --image is checked.

One test per reproducer of the "Trust first" issue (items 2 and 4), run in-process on a tiny spec
(32 px, one block) from an empty working directory, asserting exit 2, the message, and that the
user's files are untouched and nothing new was written.
"""

from __future__ import annotations

import json
import os
import stat

import pytest
from PIL import Image

from archspec.cli import main
from archspec.io import builddir

TINY = """\
input: {resolution: 32}
stem: {kind: patch, patch_size: 8}
stages: [{depth: 1, dim: 16, heads: 2, layers: [{range: 0, heads: ["mask:3x3", mhsa]}]}]
head: {num_classes: 10}
"""


@pytest.fixture
def cwd(tmp_path, monkeypatch):
    """An empty working directory holding the user's thesis and the tiny spec (outside it)."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "thesis.tex").write_text("my thesis\n")
    monkeypatch.chdir(work)
    return work


@pytest.fixture
def spec_file(tmp_path):
    path = tmp_path / "tiny.yaml"
    path.write_text(TINY)
    return path


def _tree(root) -> dict[str, bytes | int]:
    """Every path under ``root`` (hidden ones included) -> its bytes (regular files) or its mode (others)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            mode = os.lstat(path).st_mode
            out[os.path.relpath(path, root)] = open(path, "rb").read() if stat.S_ISREG(mode) else mode  # never a FIFO
    return out


def _build(*argv: str) -> int:
    return main(["build", *argv, "--repeats", "1", "--json"])


def _refused(capsys, *needles: str) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err and all(n in err for n in needles), err
    return err


# -- item 2: --out never deletes user files ---------------------------------------------------------------


def test_out_holding_a_user_file_is_refused_and_untouched(cwd, spec_file, capsys) -> None:
    (cwd / "mydata").mkdir()
    (cwd / "mydata" / "thesis.tex").write_text("chapter 1\n")
    before = _tree(cwd)
    assert _build(str(spec_file), "--out", "mydata") == 2
    _refused(capsys, "mydata", "--out", "thesis.tex", "choose another --out")
    assert _tree(cwd) == before


def test_out_dot_is_refused_and_the_working_directory_untouched(cwd, spec_file, capsys) -> None:
    before = _tree(cwd)
    assert _build(str(spec_file), "--out", ".") == 2
    _refused(capsys, "--out", "thesis.tex")
    assert _tree(cwd) == before


@pytest.mark.parametrize("name", ["..", ".", "../x", "a/b", ".hidden"])
def test_spec_names_that_are_not_plain_names_are_located_errors(name, cwd, tmp_path, capsys) -> None:
    spec = tmp_path / "evil.yaml"
    spec.write_text(f"name: {json.dumps(name)}\n" + TINY)
    before = _tree(cwd)
    assert _build(str(spec)) == 2
    _refused(capsys, f"{spec}:1:", "name:", "plain name", "hint:")
    assert _tree(cwd) == before


def test_a_file_named_dotdotdot_yaml_gets_a_safe_default_name(cwd, tmp_path, capsys) -> None:
    spec = tmp_path / "...yaml"  # stem '..': it used to name the build directory build/../
    spec.write_text(TINY)
    assert _build(str(spec)) == 0
    assert json.loads(capsys.readouterr().out)["out"] == os.path.join("build", "model")
    assert (cwd / "thesis.tex").read_text() == "my thesis\n"
    assert sorted(os.listdir(cwd / "build" / "model")) == sorted(builddir.BUILD_FILES)


def test_an_archspec_build_plus_a_user_file_is_refused(cwd, spec_file, capsys) -> None:
    assert _build(str(spec_file), "--out", "b") == 0
    (cwd / "b" / "notes.txt").write_text("mine\n")
    before = _tree(cwd)
    assert _build(str(spec_file), "--out", "b") == 2
    _refused(capsys, "notes.txt", "never deletes")
    assert _tree(cwd) == before


def test_a_build_of_archspec_0_1_is_replaced(cwd, spec_file) -> None:
    """archspec 0.1.0 wrote no marker, but its report always held the same keys: that build is ours."""
    assert _build(str(spec_file), "--out", "b") == 0
    report = json.loads((cwd / "b" / "report.json").read_text())
    del report[builddir.MARKER]
    (cwd / "b" / "report.json").write_text(json.dumps(report))
    assert _build(str(spec_file), "--out", "b") == 0
    assert builddir.MARKER in json.loads((cwd / "b" / "report.json").read_text())


def test_a_build_without_the_marker_is_refused(cwd, spec_file, capsys) -> None:
    """A user's own spec.yaml/report.json (no marker, not a 0.1.0 report) is not ours to replace."""
    assert _build(str(spec_file), "--out", "b") == 0
    report = json.loads((cwd / "b" / "report.json").read_text())
    del report[builddir.MARKER], report["latency_protocol"]
    (cwd / "b" / "report.json").write_text(json.dumps(report))
    before = _tree(cwd)
    assert _build(str(spec_file), "--out", "b") == 2
    _refused(capsys, "not marked as an archspec build")
    assert _tree(cwd) == before


def test_links_and_files_as_out_are_refused(cwd, spec_file, capsys) -> None:
    (cwd / "real").mkdir()
    (cwd / "link").symlink_to(cwd / "real")
    before = _tree(cwd)
    assert _build(str(spec_file), "--out", "link") == 2
    _refused(capsys, "symbolic link")
    assert _build(str(spec_file), "--out", "thesis.tex") == 2
    _refused(capsys, "not a directory")
    assert _tree(cwd) == before


def test_an_empty_out_is_written_into_and_a_build_is_replaced(cwd, spec_file, capsys) -> None:
    (cwd / "empty").mkdir()
    inode = os.stat(cwd / "empty").st_ino
    assert _build(str(spec_file), "--out", "empty") == 0
    assert os.stat(cwd / "empty").st_ino == inode  # the user's directory itself, not a replacement
    assert builddir.is_build(cwd / "empty")
    capsys.readouterr()
    assert _build(str(spec_file), "--out", "empty", "--seed", "5") == 0  # replaces the build
    assert json.loads((cwd / "empty" / "report.json").read_text())["seed"] == 5
    assert sorted(os.listdir(cwd)) == ["empty", "thesis.tex"]  # no staging directory left behind


# -- crash-safe replacement ------------------------------------------------------------------------------


def _fake_build(directory, seed: int) -> None:
    """What archspec writes, small: the report (with marker) and two files, as write_build's fill does."""
    (directory / "spec.yaml").write_text(f"seed: {seed}\n")
    (directory / "model.safetensors").write_bytes(bytes(seed))


def _write(out, seed: int):
    return builddir.write_build(out, lambda d: _fake_build(d, seed), {"seed": seed})


def _seed_of(out) -> int:
    return json.loads((out / "report.json").read_text())["seed"]


def test_renameat2_exchange_swaps_two_directories(tmp_path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    (a / "x").write_text("a"), (b / "y").write_text("b")
    if not builddir._renameat2(a, b, builddir._RENAME_EXCHANGE):
        pytest.skip("no renameat2(RENAME_EXCHANGE) here: swap_in uses the two-step fallback")
    assert os.listdir(a) == ["y"] and os.listdir(b) == ["x"]


def test_old_build_is_complete_until_the_swap_and_the_new_one_after(tmp_path, monkeypatch) -> None:
    out = tmp_path / "b"
    _write(out, 1)
    real_swap = builddir.swap_in

    def checked_swap(staging, target):
        assert builddir.is_build(target) and _seed_of(target) == 1  # old build whole right up to the swap
        assert builddir.is_build(staging) and _seed_of(staging) == 2  # new build whole before it
        old = real_swap(staging, target)
        assert builddir.is_build(target) and _seed_of(target) == 2
        return old

    monkeypatch.setattr(builddir, "swap_in", checked_swap)
    _write(out, 2)
    assert _seed_of(out) == 2 and os.listdir(tmp_path) == ["b"]


class Killed(BaseException):
    """Stands for SIGKILL: no ``except Exception`` handler runs."""


def test_a_failure_before_the_swap_leaves_the_old_build_intact(tmp_path) -> None:
    out = tmp_path / "b"
    _write(out, 1)
    before = _tree(tmp_path)

    def dies(directory):
        _fake_build(directory, 2)
        raise Killed

    with pytest.raises(Killed):
        builddir.write_build(out, dies, {"seed": 2})
    assert _tree(tmp_path) == before  # old build as it was, staging removed


# NAME_MAX is 255 bytes: `.<240 characters>.archspec-tmp-XXXXXXXX` would pass it, so staging names are shortened
LONG = "b" * 240


@pytest.mark.parametrize("name", ["b", LONG], ids=["short", "240 characters"])
def test_two_step_fallback_killed_between_renames_keeps_the_old_build(tmp_path, monkeypatch, name) -> None:
    """Without renameat2: OUT -> .b.archspec-old-*, then staging -> OUT; a kill in between is the documented window."""
    out = tmp_path / name
    _write(out, 1)
    monkeypatch.setattr(builddir, "_renameat2", lambda *a: False)
    real_rename = os.rename
    calls = []

    def rename(src, dst):
        calls.append((src, dst))
        if len(calls) == 2:
            raise Killed
        real_rename(src, dst)

    monkeypatch.setattr(builddir.os, "rename", rename)
    with pytest.raises(Killed):
        _write(out, 2)
    monkeypatch.setattr(builddir.os, "rename", real_rename)
    aside = [p for p in tmp_path.iterdir() if ".archspec-old-" in p.name]
    assert not out.exists() and len(aside) == 1 and builddir.is_build(aside[0]) and _seed_of(aside[0]) == 1
    _write(out, 3)  # the next build of OUT cleans the leftover
    assert _seed_of(out) == 3 and os.listdir(tmp_path) == [name]


def test_a_240_character_out_is_built_and_replaced_leaving_no_staging(cwd, spec_file) -> None:
    assert _build(str(spec_file), "--out", LONG) == 0  # staged in a sibling, renamed to OUT
    assert _build(str(spec_file), "--out", LONG) == 0  # staged, then exchanged with the old build
    assert sorted(os.listdir(cwd)) == sorted([LONG, "thesis.tex"]) and builddir.is_build(cwd / LONG)


def test_leftover_cleanup_removes_only_unlocked_archspec_staging(tmp_path) -> None:
    out = tmp_path / "b"
    ours, foreign, busy, other = (tmp_path / n for n in (".b.archspec-tmp-abc", ".b.archspec-tmp-def",
                                                           ".b.archspec-tmp-ghi", ".c.archspec-tmp-abc"))
    for d in (ours, foreign, busy, other):
        d.mkdir()
        builddir.write_report(d / "report.json", {})
    (foreign / "thesis.tex").write_text("mine\n")
    fd = builddir._lock(busy, blocking=True)  # a build running in another process
    try:
        assert builddir.clean_leftovers(out) == [ours]
    finally:
        os.close(fd)
    assert foreign.exists() and busy.exists() and other.exists()


def test_is_build_never_blocks_on_a_fifo_report(tmp_path) -> None:
    os.mkfifo(tmp_path / "report.json")
    assert not builddir.is_build(tmp_path)


@pytest.mark.parametrize("umask, dir_mode, file_mode", [(0o027, 0o750, 0o640), (0o002, 0o775, 0o664)])
@pytest.mark.parametrize("state", ["new", "empty", "build"])
def test_modes_follow_the_umask(umask, dir_mode, file_mode, state, tmp_path) -> None:
    import archspec

    model = archspec.compile(TINY)
    out = tmp_path / "b"
    old = os.umask(umask)
    try:
        if state == "empty":
            out.mkdir()
        for _ in range(2 if state == "build" else 1):  # "build": the second write replaces the first
            builddir.write_build(out, lambda d: archspec.save(model, d), {})
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(out).st_mode) == dir_mode
    assert {n: stat.S_IMODE(os.stat(out / n).st_mode) for n in os.listdir(out)} == dict.fromkeys(builddir.BUILD_FILES,
                                                                                                 file_mode)


# -- item 4: --image -------------------------------------------------------------------------------------


def test_a_fifo_as_image_is_refused_without_opening_it(cwd, spec_file, capsys) -> None:
    os.mkfifo(cwd / "pipe")
    before = _tree(cwd)
    assert _build(str(spec_file), "--image", "pipe") == 2  # used to hang forever
    _refused(capsys, "pipe", "--image", "FIFO")
    assert _tree(cwd) == before


@pytest.mark.parametrize("path, kind", [("/dev/zero", "character device"), (".", "directory")])
def test_devices_and_directories_as_image_are_refused(path, kind, cwd, spec_file, capsys) -> None:
    before = _tree(cwd)
    assert _build(str(spec_file), "--image", path) == 2
    _refused(capsys, path, kind, "JPEG or PNG")
    assert _tree(cwd) == before


@pytest.mark.slow
def test_a_15000_square_png_is_refused_naming_its_pixels(cwd, spec_file, capsys) -> None:
    Image.new("1", (15000, 15000)).save(cwd / "bomb.png")
    assert (cwd / "bomb.png").stat().st_size < 100_000  # a small file: the size check alone would not catch it
    before = _tree(cwd)
    assert _build(str(spec_file), "--image", "bomb.png") == 2  # was DecompressionBombError, exit 1
    _refused(capsys, "bomb.png", "225,000,000 pixels", "MAX_IMAGE_PIXELS", "resize")
    assert _tree(cwd) == before


def test_images_over_the_limit_where_pil_only_warns_are_refused(cwd, spec_file, capsys, monkeypatch) -> None:
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)  # PIL warns above 1000 pixels and raises above 2000
    Image.new("L", (40, 40)).save(cwd / "big.png")
    assert _build(str(spec_file), "--image", "big.png") == 2
    _refused(capsys, "big.png", "1,600 pixels")
    assert sorted(os.listdir(cwd)) == ["big.png", "thesis.tex"]
