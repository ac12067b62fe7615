"""Issue 58 item 5: the library's errors name fields and parameters (``budgets.macs``, ``out``); ``archspec.cli``
maps them to its flags (:meth:`archspec.errors.SpecError.with_options`, the tables in :mod:`archspec.cli.options`).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from archspec.errors import Problem, SpecError

ROOT = Path(__file__).resolve().parents[1]
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]+")
# The calls that build an error the user reads, besides any ``raise``.
ERROR_CALLS = {"single", "Problem", "SpecError", "renamed", "_out_error"}
# (file relative to archspec/, a piece of the string) -> why a flag may stay in that raised string
ALLOWED: dict[tuple[str, str], str] = {
    ("train/run.py", "archspec train "): "the hint spells out the command to run: `archspec train SPEC ... --resume`",
    ("search/_engine/preflight.py", "bench/space_table.py"): "a bench script's own options, not archspec's",
    ("search/_tabulation/oracle.py", "bench/space_table.py"): "a bench script's own options, not archspec's",
    ("deploy/int8.py", "`archspec build SPEC --int8"): "the hint spells out the command that writes the int8 file",
    ("io/artifact.py", "`archspec validate DIR --allow-spec-change`"):
        "the hint gives both ways to load a changed spec, the Python call (allow_spec_change=True) and the command "
        "to run (every verb that loads a build prints it, not only those with --allow-spec-change)",
}


def _strings(node: ast.AST):
    """The string constants under ``node``; an f-string as its literal parts joined by ``{}``."""
    inside = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.JoinedStr):
            parts = [v.value if isinstance(v, ast.Constant) else "{}" for v in sub.values]
            inside.update(id(v) for v in sub.values)
            yield sub.lineno, "".join(str(p) for p in parts)
        elif isinstance(sub, ast.Constant) and isinstance(sub.value, str) and id(sub) not in inside:
            yield sub.lineno, sub.value


def _call_name(call: ast.Call) -> str:
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def flags_in_raised_text(path: Path, allowed: tuple[str, ...] = ()) -> list[str]:
    """``line: --flag`` for each command-line flag in a string of a ``raise`` or an error-building call (but in a
    string holding one of ``allowed``)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Raise) and node.exc is not None:
            roots = [node.exc]
        elif isinstance(node, ast.Call) and _call_name(node) in ERROR_CALLS:
            roots = [node]
        else:
            continue
        for root in roots:
            for line, text in _strings(root):
                if any(piece in text for piece in allowed):
                    continue
                found.update(f"{line}: {flag}" for flag in FLAG.findall(text))
    return sorted(found, key=lambda s: int(s.split(":")[0]))


def library_files() -> list[Path]:
    package = ROOT / "archspec"
    return [p for p in sorted(package.rglob("*.py")) if "cli" not in p.relative_to(package).parts]


def test_the_library_raises_no_command_line_flag():
    found = {}
    for path in library_files():
        rel = str(path.relative_to(ROOT / "archspec"))
        allowed = tuple(piece for (file, piece) in ALLOWED if file == rel)
        if hits := flags_in_raised_text(path, allowed):
            found[rel] = hits
    assert not found, found


def test_the_check_catches_a_flag_in_a_raise_and_in_a_problem(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("from archspec.errors import Problem, SpecError\n"
                      "def f(x):\n"
                      "    if x:\n"
                      "        raise ValueError(f'bad {x}; give --out')\n"
                      "    p = Problem(('out',), 'fine', 'try --resume')\n"
                      "    return SpecError.single(('out',), 'give another `out`')\n")
    assert flags_in_raised_text(module) == ["4: --out", "5: --resume"]


def test_with_options_renames_code_quoted_fields_only():
    exc = SpecError([Problem(("out",), "holds an earlier run", "add `restart` to replace it, or give another `out`",
                             "/tmp/r"),
                     Problem(("config", "batch_size"), "`config.batch_size` exceeds config.batch_size; out of range"),
                     Problem(("seed",), "must be an integer; seed the `out`", file="spec.yaml", line=3, column=1),
                     Problem(("out",), "line 2 is damaged", "resume from `out`", file="study.log", line=2)])
    mapped = exc.with_options({("out",): "--out", ("restart",): "--restart", ("config", "batch_size"): "--batch-size",
                               ("seed",): "--seed"})
    first, second, third, fourth = mapped.problems
    assert first.path == ("--out",) and first.hint == "add --restart to replace it, or give another --out"
    assert first.format() == ("/tmp/r: --out: holds an earlier run\n"
                              "    hint: add --restart to replace it, or give another --out")
    # a bare name may be English ("out of range") or a field of a file: only the quoted one is renamed
    assert second.path == ("--batch-size",) and second.message == "--batch-size exceeds config.batch_size; out of range"
    # a problem at a line of a YAML file is a place in that document, not a parameter; in another file it is
    assert third == exc.problems[2]
    assert fourth.format() == "study.log:2:1: --out: line 2 is damaged\n    hint: resume from --out"


def test_fit_names_its_keywords_and_archspec_train_its_flags(tmp_path, capsys):
    """The same refusal: a Python caller reads ``restart``/``resume``/``out``, the command line its flags."""
    import pytest

    from archspec.cli import main
    from archspec.train.run import fit

    with pytest.raises(SpecError) as info:
        fit("levit_128s", "digits", out=tmp_path / "r", resume=True, restart=True, progress=False)
    assert str(info.value) == ("<spec>: restart: cannot be combined with `resume`\n"
                               "    hint: `resume` continues the run in `out`; `restart` replaces it")
    assert main(["train", "levit_128s", "--out", str(tmp_path / "r"), "--resume", "--restart"]) == 2
    assert capsys.readouterr().err == ("archspec train: error\n--restart: cannot be combined with --resume\n"
                                       "    hint: --resume continues the run in --out; --restart replaces it\n")


def test_a_train_setting_is_its_config_field_in_python_and_its_option_on_the_command_line(capsys):
    import pytest

    from archspec.cli import main
    from archspec.train.config import check_config, recipe

    with pytest.raises(SpecError) as info:
        check_config(recipe("short", warmup_epochs=-2.0))
    assert info.value.problems[0].path == ("config", "warmup_epochs")
    assert main(["train", "levit_128s", "--warmup-epochs", "-2"]) == 2
    assert capsys.readouterr().err == "archspec train: error\n--warmup-epochs: must be a number >= 0, got -2.0\n"


def test_run_design_names_its_keywords_and_archspec_search_its_flags(tmp_path, capsys):
    import pytest

    from archspec.cli import main
    from archspec.search import run_design

    with pytest.raises(SpecError) as info:
        run_design(oracle_subset=True, out=tmp_path / "r", progress=False)
    assert str(info.value) == ("<spec>: oracle_subset: `oracle_subset` needs `oracle` TABLE\n"
                               "    hint: add `oracle` levit_small (or a table file), or drop `oracle_subset`")
    assert main(["search", "--oracle-subset", "--out", str(tmp_path / "r")]) == 2
    announcement, err = capsys.readouterr().err.split("\n", 1)  # what it would have done (issue 80.8), then why not
    assert announcement.startswith("archspec search over space levit_family (default): ")
    assert err == (
        "archspec search: error\n--oracle-subset: --oracle-subset needs --oracle TABLE\n"
        "    hint: add --oracle levit_small (or a table file), or drop --oracle-subset\n")
    assert not (tmp_path / "r").exists()


DATA_HINT = ("give {0} fashion-mnist, a CIFAR-10/100 directory (cifar-10-batches-py, cifar-100-python), a directory of "
             "Fashion-MNIST IDX files or an ImageFolder directory (one sub-directory per class), or leave {0} out for "
             "the built-in digits")


def test_a_data_source_is_data_in_python_and_data_or_calibrate_on_the_command_line(tmp_path, capsys):
    """check_source names the field ``data``; train and search say ``--data``, build and export ``--calibrate``."""
    import pytest

    from archspec.cli import main
    from archspec.io.data_sources import check_source

    nope = tmp_path / "nope"
    with pytest.raises(SpecError) as info:
        check_source(nope)
    assert str(info.value) == f"{nope}: data: no such file or directory: {nope}\n    hint: {DATA_HINT.format('`data`')}"
    assert main(["search", "--data", str(nope), "--out", str(tmp_path / "s")]) == 2
    announcement, err = capsys.readouterr().err.split("\n", 1)
    assert announcement.startswith("archspec search over space levit_family (default): ")
    assert err == (f"archspec search: error\n{nope}: --data: no such file or directory: {nope}\n"
                                       f"    hint: {DATA_HINT.format('--data')}\n")
    assert main(["train", "levit_128s", "--data", str(nope)]) == 2
    assert capsys.readouterr().err == (f"archspec train: error\n{nope}: --data: no such directory\n"
                                       f"    hint: {DATA_HINT.format('--data')}\n")
    for command in (["build", "levit_128s", "--out", str(tmp_path / "b")],
                    ["export", "levit_128s", "--onnx", str(tmp_path / "m.onnx")]):
        assert main([*command, "--int8", "--calibrate", str(nope)]) == 2
        assert capsys.readouterr().err == (f"archspec {command[0]}: error\n"
                                           f"{nope}: --calibrate: no such file or directory: {nope}\n"
                                           f"    hint: {DATA_HINT.format('--calibrate')}\n")
    assert not (tmp_path / "s").exists() and not (tmp_path / "b").exists() and not (tmp_path / "m.onnx").exists()


def test_an_output_directory_is_out_in_python_and_out_flag_on_the_command_line(tmp_path, capsys):
    """check_out names the parameter ``out``; build, inspect and tcnn say ``--out``."""
    import pytest

    from archspec.cli import main
    from archspec.io.builddir import check_out

    afile = tmp_path / "thesis.tex"
    afile.write_text("x")
    with pytest.raises(SpecError) as info:
        check_out(afile)
    assert str(info.value) == f"{afile}: out: exists and is not a directory\n    hint: choose another `out`"
    for command in (["build", "levit_128s"], ["inspect", "levit_128s"], ["tcnn", "resnet18"]):
        assert main([*command, "--out", str(afile)]) == 2
        assert capsys.readouterr().err == (f"archspec {command[0]}: error\n{afile}: --out: exists and is not a "
                                           f"directory\n    hint: choose another --out\n")
    assert afile.read_text() == "x"


def test_a_table_file_is_table_or_out_in_python_and_import_or_export_on_the_command_line(tmp_path, capsys):
    """import_table's ``table`` (load_table's ``oracle``, renamed) and export_table's ``out``: --import, --export."""
    import pytest

    from archspec.cli import main
    from archspec.search._tabulation.exchange import export_table, import_table

    nope, text = tmp_path / "nope.jsonl", tmp_path / "t.txt"
    with pytest.raises(SpecError) as info:
        import_table("levit_small", nope, storage=f"journal:{tmp_path / 't.journal'}")
    assert str(info.value) == f"{nope}: table: no such table\n    hint: shipped tables: levit_small, mait_small"
    with pytest.raises(SpecError) as info:
        export_table("levit_small", text)
    assert str(info.value) == f"{text}: out: a table file ends in .jsonl\n    hint: e.g. levit_small.jsonl"
    assert main(["table", "levit_small", "--import", str(nope), "--storage", f"journal:{tmp_path / 't.journal'}"]) == 2
    assert capsys.readouterr().err == (f"archspec table: error\n{nope}: --import: no such table\n"
                                       "    hint: shipped tables: levit_small, mait_small\n")
    assert main(["table", "levit_small", "--export", str(text)]) == 2
    assert capsys.readouterr().err == (f"archspec table: error\n{text}: --export: a table file ends in .jsonl\n"
                                       "    hint: e.g. levit_small.jsonl\n")
