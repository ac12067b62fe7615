"""The front door stays light: ``archspec --help``, ``list``, ``schema`` and ``validate SPEC`` never import torch,
timm or torchvision.

Each command runs in a fresh interpreter through the CLI entry point (:func:`archspec.cli.main`); afterwards
the same process reports which heavy modules ``sys.modules`` holds.  Nothing is patched or pre-imported:
what the command imports is what a user pays for.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SPECS = ROOT / "specs"
HEAVY = ("torch", "timm", "torchvision", "onnx", "onnxruntime", "torchao")
MARK = "FRONT-DOOR "

# Run the CLI as `archspec ARGS` would, then say what it imported (stdout is the command's own).
PROBE = f"""
import json, sys
before = [m for m in {HEAVY!r} if m in sys.modules]
from archspec.cli import main
argv = json.loads(sys.argv[1])
rc = main(argv)
sys.stdout.flush()
loaded = [m for m in {HEAVY!r} + ("optuna",) if m in sys.modules]
print({MARK!r} + json.dumps({{"rc": rc, "before": before, "loaded": loaded}}), file=sys.stderr)
"""

COMMANDS = [
    pytest.param(["--help"], 0, id="help"),
    pytest.param(["--version"], 0, id="version"),
    pytest.param(["list"], 0, id="list"),  # counts every shipped spec: LeViT, CaiT and CMHSA-conv ones too
    pytest.param(["schema"], 0, id="schema"),
    pytest.param(["schema", "--markdown"], 0, id="schema-markdown"),
    pytest.param(["schema", "--space"], 0, id="schema-space"),
    pytest.param(["validate", str(SPECS / "mait_tiny_sch2.yaml")], 0, id="validate-mait"),
    pytest.param(["validate", "masked_cait_xxs24", "--json"], 0, id="validate-masked-cait"),
    pytest.param(["validate", str(SPECS / "cmhsa_k3.yaml")], 0, id="validate-cmhsa-attention"),
    pytest.param(["validate", "convit_tiny"], 0, id="validate-convit"),
    pytest.param(["validate", str(SPECS / "levit_128s.yaml")], 0, id="validate-levit"),
    pytest.param(["validate", "cait_xxs24"], 0, id="validate-cait"),
    pytest.param(["validate", "cmhsa_k3_conv"], 0, id="validate-cmhsa-conv"),
    pytest.param(["search", "--help"], 0, id="search-help"),
    pytest.param(["search", "masks", "--help"], 0, id="search-masks-help"),
    pytest.param(["two-phase", "--help"], 0, id="two-phase-help"),
    pytest.param(["tcnn", "--help"], 0, id="tcnn-help"),
    pytest.param(["build", "--help"], 0, id="build-help"),  # --int8 / --torch-compile imported nothing at parse time
    pytest.param(["export", "--help"], 0, id="export-help"),  # nor onnx
]


def _run(argv: list[str], cwd: Path) -> tuple[dict, subprocess.CompletedProcess]:
    """Run ``archspec ARGV`` in a fresh interpreter: (the probe's report, the process)."""
    proc = subprocess.run([sys.executable, "-c", PROBE, json.dumps(argv)], cwd=cwd, capture_output=True, text=True,
                          timeout=300)
    lines = [line for line in proc.stderr.splitlines() if line.startswith(MARK)]
    assert lines, f"the probe did not report (exit {proc.returncode}):\n{proc.stderr[-3000:]}"
    return json.loads(lines[-1][len(MARK):]), proc


@pytest.mark.parametrize("argv, status", COMMANDS)
def test_command_imports_no_torch(argv, status, tmp_path):
    report, proc = _run(argv, tmp_path)
    assert report["before"] == [], f"the interpreter imported {report['before']} before archspec ran (sitecustomize?)"
    assert report["rc"] == status, proc.stderr[-3000:]
    heavy = [m for m in report["loaded"] if m in HEAVY]
    assert not heavy, f"`archspec {' '.join(argv)}` imported {heavy}"


def test_bad_spec_exits_2_without_torch(tmp_path):
    """A user mistake is a located message and exit 2, still without torch."""
    text = (SPECS / "mait_tiny_sch2.yaml").read_text(encoding="utf-8")
    bad = tmp_path / "bad.yaml"
    bad.write_text(text + "\nnot_a_field: 3\n", encoding="utf-8")
    report, proc = _run(["validate", str(bad)], tmp_path)
    assert report["rc"] == 2
    assert "archspec validate: error" in proc.stderr and "not_a_field" in proc.stderr
    assert "bad.yaml" in proc.stderr  # located: the file is named
    assert not [m for m in report["loaded"] if m in HEAVY]


@pytest.mark.parametrize("argv", [["--help"], ["search", "--help"], ["schema"]], ids=" ".join)
def test_parser_imports_no_optuna(argv, tmp_path):
    """Building the parser reads the search defaults from archspec.search._engine.defaults (stdlib only)."""
    report, _ = _run(argv, tmp_path)
    assert report["rc"] == 0 and "optuna" not in report["loaded"]


def test_transfer_all_lists_every_lazy_export():
    """``archspec.transfer.__all__`` is a literal (the API docs read it statically); it must name every export."""
    import archspec.transfer as transfer

    assert sorted(transfer.__all__) == sorted(transfer._EXPORTS)


# What the parser and `import archspec` need is the standard library: the spec parser (pydantic), the IR
# (networkx), YAML and rich load when a command runs that uses them (issue 58 item 6).
READ_ONLY_FREE = ("networkx",) + HEAVY
PARSER_FREE = ("pydantic", "networkx", "yaml", "rich", "numpy", "optuna") + HEAVY


def _loaded_after(code: str, modules: tuple[str, ...], cwd: Path) -> str:
    """Run ``code`` in a fresh interpreter (a ``SystemExit`` is caught); which of ``modules`` it imported, as the
    repr of a sorted list."""
    body = "\n".join("    " + line for line in code.splitlines())
    probe = (f"import sys\ntry:\n{body}\nexcept SystemExit:\n    pass\n"
             f"print({MARK!r} + repr(sorted(m for m in {modules!r} if m in sys.modules)), file=sys.stderr)")
    proc = subprocess.run([sys.executable, "-c", probe], cwd=cwd, capture_output=True, text=True, timeout=120)
    lines = [line for line in proc.stderr.splitlines() if line.startswith(MARK)]
    assert lines, proc.stderr[-3000:]
    return lines[-1][len(MARK):]


@pytest.mark.parametrize("code", [
    "import archspec",
    "import archspec.search",
    "from archspec.cli.app import make_parser; make_parser()",
    "from archspec.cli import main; main(['--help'])",
    "from archspec.cli import main; main(['search', '--help'])",
    "from archspec.cli import main; main(['train', '--help'])",
], ids=["import-archspec", "import-search", "make-parser", "help", "search-help", "train-help"])
def test_the_parser_and_import_archspec_need_only_the_standard_library(code, tmp_path):
    loaded = _loaded_after(code, PARSER_FREE, tmp_path)
    assert loaded == "[]", f"{code!r} imported {loaded}"


@pytest.mark.parametrize("argv", [["validate", "mait_tiny_sch2"], ["list"], ["schema"]], ids=" ".join)
def test_read_only_commands_do_not_import_networkx(argv, tmp_path):
    """``validate``, ``list`` and ``schema`` read the IR's plan (:mod:`archspec.ir.plan`), a plain value; the
    networkx graph is built from it only where a graph is used (compile, the search)."""
    loaded = _loaded_after(f"from archspec.cli import main\nmain({argv!r})", READ_ONLY_FREE, tmp_path)
    assert loaded == "[]", f"archspec {' '.join(argv)} imported {loaded}"


def test_a_bad_train_option_is_refused_before_the_spec_parser_and_torch(tmp_path):
    """``archspec train SPEC --data nope`` took 11.5 s (torch, timm, the training stack imported first): the data
    source is checked before anything heavy is imported."""
    report, proc = _run(["train", "levit_128s", "--data", str(tmp_path / "nope")], tmp_path)
    assert report["rc"] == 2 and "--data: no such directory" in proc.stderr
    assert not [m for m in report["loaded"] if m in HEAVY], report


# A fixed unit of pure-Python work, run in a fresh interpreter like the commands: compiling and executing 400
# small classes five times, then a 200,000-entry dict -- the kind of work an import is (unmarshal, exec, class
# bodies), in Python and the standard library only, so it changes with the machine and not with pydantic or rich.
# It prints its own seconds (interpreter start-up excluded).
CALIBRATION = (
    "import time\nstart = time.perf_counter()\n"
    "src = '\\n'.join(f'class C{i}:\\n    a{i} = {i}\\n    def f(self, x): return x + {i}' for i in range(400))\n"
    "for _ in range(5): exec(compile(src, 'calibration', 'exec'), {})\n"
    "table = {str(i): i * i for i in range(200_000)}\n"
    "print(time.perf_counter() - start)"
)


def _user_env(cache: Path) -> dict[str, str]:
    """The environment a user's shell gives a command: bytecode written and reused (here under ``cache``, so the
    checkout gets no ``__pycache__``).  A ``PYTHONDONTWRITEBYTECODE=1`` environment -- this project's VM has one,
    and ``.ci/run`` inherits it where it is set -- made every run compile archspec's ~60 modules from source again
    (0.17 s of a 0.99 s validate under cProfile), a cost no user pays twice."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = str(cache)
    return env


def _fastest_seconds(argv: list[str], runs: int, env: dict[str, str]) -> tuple[float, float]:
    """(fastest of ``runs`` runs of ``argv``, fastest of ``runs`` calibration units), the two interleaved after one
    unrecorded run that writes the bytecode: whatever else the machine runs (the other test worker) only adds
    time, so the minimum is the estimate it disturbs least, and interleaving gives both the same moments."""
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120, env=env)
    took, unit = [], []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120, env=env)
        took.append(time.perf_counter() - start)
        unit.append(float(subprocess.run([sys.executable, "-c", CALIBRATION], capture_output=True, text=True,
                                         timeout=120, env=env, check=True).stdout))
    return min(took), min(unit)


# command -> (at most this many seconds, or at most this many calibration units, whichever is larger), fastest of 5
# runs.  The seconds are what the user feels ("well under a second"); each is 2.5x or more above what 2 busy cores
# measured at issue 58 (import 0.04 s, --help 0.07-0.10 s, a bad --data 0.10 s, validate 0.27 s, list 0.32 s, schema
# 0.21 s), and below what one heavy import costs (torch alone is over 1 s).  A ratio to the empty interpreter did not
# carry between machines (CI's `python -c pass` at 0.011 s read --help at 10x, here 4x), and seconds alone failed on
# a slow day: stop 75's CI read validate 0.721 s and schema 0.720 s with the code unchanged since they passed, and
# this VM, about twice as slow as usual that evening, read the same 0.5-0.9 s at the commit that set the ceilings
# (5d0ca28) as at the code that failed.  So a slow machine is allowed the units.  Measured on that VM, idle and with
# both cores busy (calibration 0.17-0.29 s): import 0.40-0.64 units, --help 0.57-0.62, search --help 0.76-0.90, a
# bad --data 0.68-0.96, validate 2.3-2.9, list 3.0-3.5, schema 1.5-2.8 (`python -m pytest -n 0
# tests/test_front_door.py -k ceiling -s` prints them); each unit ceiling is about twice the most measured, so on a
# slow machine a command that doubles its work fails.
FRONT_DOOR_CEILINGS = [
    pytest.param(["-c", "import archspec"], 0.15, 1.5, id="import-archspec"),
    pytest.param(["-m", "archspec", "--help"], 0.3, 2.0, id="help"),
    pytest.param(["-m", "archspec", "search", "--help"], 0.3, 2.0, id="search-help"),
    pytest.param(["-m", "archspec", "train", "levit_128s", "--data", "/no/such/data"], 0.3, 2.0, id="train-bad-data"),
    pytest.param(["-m", "archspec", "validate", str(SPECS / "mait_tiny_sch2.yaml")], 0.7, 5.5, id="validate"),
    pytest.param(["-m", "archspec", "list"], 0.8, 7.0, id="list"),  # 32 shipped specs parsed, checked and counted
    pytest.param(["-m", "archspec", "schema"], 0.55, 5.5, id="schema"),
]


@pytest.mark.slow
@pytest.mark.parametrize("args, seconds, units", FRONT_DOOR_CEILINGS)
def test_front_door_answers_within_its_ceiling(args, seconds, units, tmp_path):
    took, unit = _fastest_seconds([sys.executable, *args], 5, _user_env(tmp_path / "pycache"))
    print(f"{' '.join(args)}: {took:.3f} s, {took / unit:.2f} units of {unit:.3f} s")
    assert took <= max(seconds, units * unit), (
        f"{' '.join(args)}: {took:.3f} s, over {seconds} s and over {units} calibration units "
        f"({took / unit:.2f} units of {unit:.3f} s)")


def test_no_help_text_shows_restructuredtext_markup():
    """Every ``--help`` is plain text: no ``literal`` double backquotes nor :func:-style roles (``archspec table
    --help`` printed its module docstring, roles and all)."""
    import argparse
    import re

    from archspec.cli.app import make_parser

    def walk(parser, name):
        yield name, parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub, subparser in action.choices.items():
                    yield from walk(subparser, f"{name} {sub}")

    shown = {name: re.findall(r"``|:(?:func|class|mod|meth|data|attr):`", parser.format_help())
             for name, parser in walk(make_parser(), "archspec")}
    assert len(shown) > 10 and "archspec table" in shown
    assert not {name: set(found) for name, found in shown.items() if found}
