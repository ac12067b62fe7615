"""No input file gives a traceback or a hang: hostile YAML and odd files through validate, build and --space.

Each case is a reproducer from the "Trust first" issue; each asserts exit 2, a message naming the file
(and the line and column where the problem has one), and that nothing was written.
"""

from __future__ import annotations

import os
import resource
import signal
import time
from pathlib import Path

import pytest

from archspec import load_spec
from archspec.cli import main
from archspec.errors import SpecError
from archspec.spec.yaml_source import MAX_NESTING, is_yaml_text, load_yaml

TINY = "{name: t, input: {resolution: 32}, stem: {kind: patch, patch_size: 8}, " \
       "stages: [{depth: 1, dim: 32, heads: 2}], head: {num_classes: 10}}"


@pytest.fixture()
def no_hang():
    """Fail (instead of hanging the suite) when a call blocks for 10 s, e.g. opening a FIFO."""
    def alarm(signum, frame):
        raise TimeoutError("blocked for 10 s")

    old = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(10)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


def _commands(path: Path, out: Path) -> dict[str, list[str]]:
    """The three entry points that read a YAML file the user names."""
    return {"validate": ["validate", str(path)],
            "build": ["build", str(path), "--out", str(out), "--repeats", "1"],
            "search --space": ["search", "--space", str(path), "--out", str(out), "--no-progress"]}


def _run_all(path: Path, tmp_path: Path, capsys, needles: list[str]) -> None:
    """Every command exits 2, names the file and ``needles``, and writes nothing."""
    before = sorted(tmp_path.rglob("*"))
    for label, argv in _commands(path, tmp_path / "out").items():
        assert main(argv) == 2, label
        err = capsys.readouterr().err
        assert "Traceback" not in err
        for needle in [path.name, *needles]:
            assert needle in err, (label, needle, err)
    assert sorted(tmp_path.rglob("*")) == before


# ----------------------------------------------------------------------------------- hostile YAML
@pytest.mark.slow
def test_deep_nesting_is_located(tmp_path, capsys):
    path = tmp_path / "deep.yaml"
    path.write_text("[" * 1000 + "]" * 1000)  # 2 kB; PyYAML's composer alone raises RecursionError
    assert path.stat().st_size == 2000
    # the 101st '[' (column 101) is where it gets too deep
    _run_all(path, tmp_path, capsys, [f"{path.name}:1:{MAX_NESTING + 1}:", f"more than {MAX_NESTING} levels"])


def test_recursive_alias_is_located(tmp_path, capsys):
    path = tmp_path / "rec.yaml"
    path.write_text("name: t\nstages: &a [*a]\n")
    _run_all(path, tmp_path, capsys, [f"{path.name}:2:9:", "recursive alias"])


def test_complex_key_is_located(tmp_path, capsys):
    path = tmp_path / "key.yaml"
    path.write_text("name: t\n[1, 2]: 3\n")
    _run_all(path, tmp_path, capsys, [f"{path.name}:2:1:", "keys must be plain names"])


def test_alias_chain_depth_is_capped():
    # Every anchor nests one level inside the previous one: 2 levels of brackets, 150 levels of value.
    lines = ["a0: &a0 [1]"] + [f"a{i}: &a{i} [*a{i - 1}]" for i in range(1, 150)]
    with pytest.raises(SpecError, match="through aliases"):
        load_yaml("\n".join(lines) + "\n", "chain.yaml")


def test_shallow_aliases_still_load():
    data, _ = load_yaml("a: &x [1]\nb: [*x, *x]\n", "ok.yaml")
    assert data == {"a": [1], "b": [[1], [1]]}


def test_control_character_has_line_and_column(tmp_path, capsys):
    path = tmp_path / "ctl.yaml"
    path.write_text("name: t\ndescription: a\x07b\n")
    _run_all(path, tmp_path, capsys, [f"{path.name}:2:15:", "U+0007"])  # 'description: a' is 14 characters


def test_non_utf8_byte_has_line_and_column(tmp_path, capsys):
    path = tmp_path / "latin1.yaml"
    path.write_bytes("name: t\ndescription: caf\u00e9\n".encode("latin-1"))
    _run_all(path, tmp_path, capsys, [f"{path.name}:2:17:", "not UTF-8", "0xe9"])


# ----------------------------------------------------------------------------------- odd files
def test_huge_file_is_refused_from_its_size(tmp_path, capsys):
    path = tmp_path / "huge.yaml"
    with open(path, "wb") as f:
        f.truncate(10**9)  # sparse: 1 GB long, no disk used
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # kB on Linux
    start = time.perf_counter()
    _run_all(path, tmp_path, capsys, ["1,000.0 MB", "at most 1 MB"])
    assert time.perf_counter() - start < 5.0  # was 7 s for one command
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before < 100_000  # was 2.1 GB


def test_fifo_is_not_a_regular_file(tmp_path, capsys, no_hang):
    path = tmp_path / "pipe.yaml"
    os.mkfifo(path)
    _run_all(path, tmp_path, capsys, ["not a regular file"])


def test_dev_zero_is_not_a_regular_file(capsys, no_hang):
    assert main(["validate", "/dev/zero"]) == 2
    err = capsys.readouterr().err
    assert "/dev/zero" in err and "not a regular file" in err


def test_directory_is_a_directory(tmp_path, capsys):
    (tmp_path / "dir.yaml").mkdir()
    assert main(["validate", str(tmp_path / "dir.yaml")]) == 2
    assert "is a directory" in capsys.readouterr().err


# ----------------------------------------------------------------------------------- text or path
def test_one_line_yaml_text_is_yaml():
    assert load_spec(TINY).name == "t"
    assert load_spec("deit_tiny").name == "deit_tiny"  # a shipped name stays a name


@pytest.mark.parametrize("text, is_text", [
    ("{name: t}", True), ("[1, 2]", True), ("name: t", True), ("--- {}", True), ("", True), ("a\nb", True),
    ("deit_tiny", False), ("specs/x.yaml", False), ("my: odd.yaml", False), (r"C:\specs\x", False),
    ("nope.yml", False),
])
def test_is_yaml_text_rule(text, is_text):
    assert is_yaml_text(text) is is_text


def test_existing_file_with_a_colon_is_a_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("a: b").write_text(TINY)
    assert is_yaml_text("a: b") is False
    assert load_spec("a: b").name == "t"
    assert load_spec(Path("a: b")).name == "t"  # os.PathLike is always a path


@pytest.mark.parametrize("text", [
    "a: 1\na: 2\n",                      # a duplicate key: the walk's problem
    "a: [1, 2\n",                        # unclosed flow sequence: the parser's error
    "a: !!python/object:os.system x\n",  # an unsafe tag: the constructor refuses it
    "a:\tb\n",                           # a tab where PyYAML's scanner refuses one (libyaml takes it)
    "a: [1, ? b]\n",                     # a "?" key in a flow sequence (libyaml takes it)
    "a: 1\n\ufeffb: 2\n",                # a byte-order mark inside the text (libyaml refuses it)
    "a: \x07\n",                         # a control character
    "[" * (MAX_NESTING + 5),             # nesting over the cap
    "a: {b: [1, 2]}\n",                  # fine either way
    "a: '?'\n",                          # a "?" in a quoted scalar: libyaml reads it
    "a: \"Convolution?\" # why?\n",       # ... and in a comment
    "a: b#?\n",                          # "#" inside a plain scalar: not a comment, so the pure parser reads it
    "a: [x, '?', ? b]\n",                # one quoted "?", one key indicator: the pure parser
    "a: {? b: 1}\n",                     # a "?" key in a flow mapping
    "? a\n: 1\n",                        # an explicit block key
    "a: \"x#\" ?\n",                      # a "?" after a closed scalar (both refuse it)
])
def test_the_libyaml_fast_path_answers_what_the_pure_python_parser_answers(text, monkeypatch):
    """Specs are parsed by libyaml where PyYAML has it; a refusal, or a text holding what libyaml reads otherwise,
    is read by the pure-Python parser, so a text gets the same data or the same located message either way
    (issue 58 item 6: `archspec list` parsed its 32 specs in 0.18 s in pure Python, 0.02 s through libyaml)."""
    import archspec.spec.yaml_source as yaml_source

    def outcome():
        try:
            data, locator = load_yaml(text, "t.yaml")
        except SpecError as exc:
            return str(exc)
        return data, locator.positions, locator.key_positions

    fast = outcome()
    monkeypatch.setattr(yaml_source, "_FAST_LOADER", None)
    assert fast == outcome()


def test_a_question_mark_in_quotes_or_a_comment_keeps_the_libyaml_path(monkeypatch):
    """The CMHSA specs quote the paper's title ("Can Vision Transformers Perform Convolution?"): they are read by
    libyaml (the pure-Python parser, replaced here by one that fails, is never asked), a "?" key is not."""
    import archspec.spec.yaml_source as yaml_source
    from archspec.spec import SPEC_DIR

    def no_pure_parser(*args, **kwargs):
        raise AssertionError("the pure-Python parser was asked")

    monkeypatch.setattr(yaml_source, "_compose", no_pure_parser)
    text = (SPEC_DIR / "cmhsa_k3.yaml").read_text(encoding="utf-8")
    assert "?" in text and load_yaml(text, "cmhsa_k3.yaml")[0]["name"] == "cmhsa_k3"
    assert load_yaml("a: b # c?\n")[0] == {"a": "b"}
    with pytest.raises(AssertionError, match="pure-Python parser"):
        load_yaml("a: [1, ? b]\n")


def test_the_libyaml_fast_path_reads_every_shipped_spec_as_the_pure_python_parser_does(monkeypatch):
    import archspec.spec.yaml_source as yaml_source
    from archspec.spec import SPEC_DIR, shipped_specs

    texts = [(SPEC_DIR / f"{name}.yaml").read_text(encoding="utf-8") for name in shipped_specs()]
    fast = [load_yaml(text, "s.yaml") for text in texts]
    monkeypatch.setattr(yaml_source, "_FAST_LOADER", None)
    for (data, locator), text in zip(fast, texts):
        pure_data, pure_locator = load_yaml(text, "s.yaml")
        assert data == pure_data
        assert locator.positions == pure_locator.positions and locator.key_positions == pure_locator.key_positions
