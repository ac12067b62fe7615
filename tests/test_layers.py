"""The package's layers hold (issue 34): the import-linter contract in pyproject.toml passes, no module imports
another in a circle, no private name crosses a module boundary, and the contract does catch an upward import.

The layers, top to bottom (docs/architecture.md draws them): cli > search | transfer > train | deploy >
diagnostics > io | timm > nn > ir > spec > families > _util > errors | _version.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
grimp = pytest.importorskip("grimp", reason="import-linter (with grimp) comes with the test extra")


def _lint_imports(cwd: Path, pythonpath: Path) -> subprocess.CompletedProcess:
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or shutil.which("lint-imports")
    assert exe, "lint-imports is not installed (it comes with the test extra: pip install '.[test]')"
    return subprocess.run([exe, "--no-cache"], cwd=cwd, capture_output=True, text=True, timeout=300,
                          env={"PYTHONPATH": str(pythonpath), "PATH": "/usr/bin:/bin"})


def test_the_layers_contract_is_kept():
    proc = _lint_imports(ROOT, ROOT)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    assert "3 kept, 0 broken" in proc.stdout


def test_the_command_line_may_not_enter_search_by_a_side_door(tmp_path):
    """The second contract can fail: a command-line module importing a private search module is refused."""
    shutil.copytree(ROOT / "archspec", tmp_path / "archspec", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    cli = tmp_path / "archspec" / "cli" / "table.py"
    cli.write_text(cli.read_text(encoding="utf-8") + "\nfrom archspec.search._tabulation import oracle  # side door\n")
    proc = _lint_imports(tmp_path, tmp_path)
    assert proc.returncode != 0
    assert "archspec.cli.table -> archspec.search._tabulation.oracle" in proc.stdout


def test_the_search_inside_is_layered(tmp_path):
    """The third contract can fail: the evaluation importing the engine (the hub issue 82 undid) is refused."""
    shutil.copytree(ROOT / "archspec", tmp_path / "archspec", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    priors = tmp_path / "archspec" / "search" / "_evaluation" / "priors.py"
    priors.write_text(priors.read_text(encoding="utf-8") + "\nfrom archspec.search._engine import strata  # upward\n")
    proc = _lint_imports(tmp_path, tmp_path)
    assert proc.returncode != 0
    assert "archspec.search._evaluation is not allowed to import archspec.search._engine" in proc.stdout


# bench script -> why it may import any of search's private modules
BENCH_SIDE_DOORS = {
    "graph_builds.py": "counts graph builds per trial by wrapping the engine's per-trial objective",
}
# private module -> why the bench and research scripts may import it: their research measures the search's insides
# with the search's own parts (issue 82 moved these names out of the product face; a script keeps no copy of them)
RESEARCH_DOORS = {
    "archspec.search._engine.strata":
        "search_works replays the strata rule without Optuna (priors) and must pick exactly as --sampler strata does",
    "archspec.search._evaluation.check_rate": "search_costs measures the static check's rate as a search reports it",
    "archspec.search._evaluation.proxy": "proxy_rank scores untrained proxies (score_proxy) as the zero-cost rung does",
    "archspec.search._evaluation.scoring": "search_works ranks table rows by the proxy score a search ranks by",
    "archspec.search._evaluation.mask_scores":
        "the mask studies read ALS, uniform baselines and alphas off trained models as mode 2 does",
    "archspec.search._space.mask_placement": "the mask studies and soft_rows place masks on a spec as mode 2 does",
    "archspec.search._tabulation.oracle":
        "the replays read a table's curves and seconds (curve_at, linear_at, design_seconds) as --oracle does, and "
        "find the shipped tables (TABLES_DIR)",
    "archspec.search._tabulation.mask_replay": "mask_works and search_works read a mask table as the replay does",
    "archspec.search._tabulation.rows": "soft_rows and gauss_vs_masks train rows as archspec table does",
    "archspec.search._tabulation.tabulate": "space_table and soft_rows stamp rows with the table's provenance",
}


def _script_imports() -> list[tuple[str, str, list[str]]]:
    """``(script, module, names)`` of every import in bench/*.py and research/*.py (``names`` empty for ``import``)."""
    found = []
    for path in sorted([*(ROOT / "bench").glob("*.py"), *(ROOT / "research").glob("*.py")]):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                found += [(path.name, a.name, []) for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                found.append((path.name, node.module, [a.name for a in node.names]))
    return found


def test_bench_enters_search_by_its_faces_only():
    """The bench and research scripts (no package, so outside import-linter's view) import from the search's two
    faces, never from its private sub-packages -- but for the research doors and the instrumentation listed, each
    with its reason -- and only names those faces export (a script that is not run by a test would otherwise break
    unseen when a name leaves a face)."""
    import archspec.search as search
    import archspec.search.cli_support as cli_support

    faces = {"archspec.search": set(search.__all__), "archspec.search.cli_support": set(cli_support.__all__)}
    imports = _script_imports()
    side = [f"{script}: {module}" for script, module, _ in imports if module.startswith("archspec.search._")
            and script not in BENCH_SIDE_DOORS and module not in RESEARCH_DOORS]
    assert not side, side
    unknown = [f"{script}: {module}.{name}" for script, module, names in imports if module in faces
               for name in names if name not in faces[module]]
    assert not unknown, unknown
    used = {module for script, module, _ in imports if script not in BENCH_SIDE_DOORS}
    assert not set(RESEARCH_DOORS) - used, f"doors no script uses: {sorted(set(RESEARCH_DOORS) - used)}"


def test_an_upward_import_breaks_the_contract(tmp_path):
    """The contract can fail: a copy of the package whose spec language imports the compiler is refused."""
    shutil.copytree(ROOT / "archspec", tmp_path / "archspec", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    schema = tmp_path / "archspec" / "spec" / "schema.py"
    schema.write_text(schema.read_text(encoding="utf-8") + "\nfrom archspec.nn import compiler  # upward\n")
    proc = _lint_imports(tmp_path, tmp_path)
    assert proc.returncode != 0
    assert "archspec.spec is not allowed to import archspec.nn" in proc.stdout


def test_no_import_circle():
    """No module of archspec imports itself back through others (function-local imports included, and imports under
    ``if TYPE_CHECKING:``: they never run, but a circle of annotations still ties two modules into one; issue 82 ended
    the last, the search's objective and its stop rules)."""
    nx = pytest.importorskip("networkx")
    graph = grimp.build_graph("archspec", cache_dir=None, exclude_type_checking_imports=False)
    edges = nx.DiGraph((m, i) for m in graph.modules for i in graph.find_modules_directly_imported_by(m))
    cycles = list(nx.simple_cycles(edges, length_bound=8))
    assert not cycles, cycles[:5]


def test_no_private_name_is_imported_across_modules():
    found = []
    for path in (ROOT / "archspec").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("archspec")):
                found += [f"{path.relative_to(ROOT)}: {node.module}.{a.name}" for a in node.names
                          if a.name.startswith("_") and not a.name.startswith("__") and a.name != "_version"]
    assert not found, found


def _private_attributes_across_modules(root: Path) -> list[str]:
    """``obj._name`` read or written in one module of ``root/archspec`` when ``_name`` belongs to another: a private
    function, class or module-level name defined there, or an attribute set there on ``self`` / ``cls``."""
    owners: dict[str, set[str]] = {}
    uses = []
    for path in sorted((root / "archspec").rglob("*.py")):
        module = str(path.relative_to(root))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            name = None
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = node.name
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                name = node.id
            elif (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
                  and isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                name = node.attr
            if name and name.startswith("_") and not name.startswith("__"):
                owners.setdefault(name, set()).add(module)
            if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
                base = node.value
                if isinstance(base, ast.Name) and base.id in ("self", "cls"):
                    continue
                if isinstance(base, ast.Call) and isinstance(base.func, ast.Name) and base.func.id == "super":
                    continue
                uses.append((module, node.lineno, node.attr, ast.unparse(node)))
    return [f"{module}:{line}: {text} (defined in {', '.join(sorted(owners[attr]))})"
            for module, line, attr, text in uses if attr in owners and module not in owners[attr]]


def test_no_private_attribute_is_used_across_modules():
    """No module reads or writes another's private attribute (issue 58: ``ArchSpec._graph_cache``, written by the
    IR and the search, made spec, IR and search one mutable object).  Library privates (``torch._dynamo``,
    ``module._modules``) are not archspec's and are left alone."""
    found = _private_attributes_across_modules(ROOT)
    assert not found, found


def test_the_private_attribute_check_catches_a_cross_module_write(tmp_path):
    shutil.copytree(ROOT / "archspec", tmp_path / "archspec", ignore=shutil.ignore_patterns("__pycache__"))
    models = tmp_path / "archspec" / "spec" / "models.py"
    models.write_text(models.read_text(encoding="utf-8") + "\n\nclass _Cache:\n    def __init__(self):\n"
                      "        self._graph_cache = None\n", encoding="utf-8")
    graph = tmp_path / "archspec" / "ir" / "graph.py"
    graph.write_text(graph.read_text(encoding="utf-8") + "\n\ndef _keep(spec, g):\n    spec._graph_cache = g\n",
                     encoding="utf-8")
    assert any("spec._graph_cache" in f for f in _private_attributes_across_modules(tmp_path))


# Function-local imports outside archspec/cli/ (issue 58 item 4: 97 when counted, 65, then 25: the search's protocols
# and latency cache became torch-free modules, deploy/build.py imports torch at its top, torchao and SQLAlchemy load
# in one place each, imports a module's neighbours already paid for moved to the top): the ceiling only goes down.
# An optional library is imported at module level through archspec._util.imports.try_import.
LOCAL_IMPORTS_CEILING = 25


def test_function_local_imports_outside_the_command_line_say_why():
    import re

    found, bare = set(), []
    for path in sorted((ROOT / "archspec").rglob("*.py")):
        if "cli" in path.relative_to(ROOT).parts:
            continue
        lines = path.read_text(encoding="utf-8").split("\n")
        for fn in ast.walk(ast.parse("\n".join(lines))):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for node in ast.walk(fn):
                    if isinstance(node, (ast.Import, ast.ImportFrom)) and (path, node.lineno) not in found:
                        found.add((path, node.lineno))
                        text = "\n".join(lines[node.lineno - 1:node.end_lineno])
                        if not re.search(r"noqa: [A-Z0-9, ]*PLC0415 - \S", text):
                            bare.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not bare, f"function-local imports without '# noqa: PLC0415 - <why>': {bare}"
    assert len(found) <= LOCAL_IMPORTS_CEILING, f"{len(found)} function-local imports outside archspec/cli/ " \
        f"(ceiling: {LOCAL_IMPORTS_CEILING})"


def test_version_lives_in_a_leaf_module():
    tree = ast.parse((ROOT / "archspec" / "_version.py").read_text(encoding="utf-8"))
    assert not [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]


# Files of archspec/ that read a SearchConfig field (issue 82: "a search's config passes through at most 24 files";
# 15 on main before it, 14 after; docs/architecture.md, "Where a search's config goes"): the ceiling only goes down.
CONFIG_FILES_CEILING = 14


def _config_readers(root: Path) -> dict[str, set[str]]:
    """File -> what it reads of a SearchConfig: ``cfg.<field>`` (a name or attribute called ``cfg``, ``config`` or
    ``search_cfg``, and a field of SearchConfig), or the name ``SearchConfig`` in code (docstrings do not count)."""
    import dataclasses

    from archspec.search import SearchConfig

    fields = {f.name for f in dataclasses.fields(SearchConfig)}
    readers: dict[str, set[str]] = {}
    for path in sorted((root / "archspec").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            seen = None
            if isinstance(node, ast.Attribute) and node.attr in fields:
                base = node.value
                name = base.id if isinstance(base, ast.Name) else base.attr if isinstance(base, ast.Attribute) else None
                seen = f"{name}.{node.attr}" if name in ("cfg", "config", "search_cfg") else None
            elif isinstance(node, ast.Name) and node.id == "SearchConfig":
                seen = "SearchConfig"
            if seen:
                readers.setdefault(str(path.relative_to(root)), set()).add(seen)
    return readers


def test_a_search_config_passes_through_few_files():
    readers = _config_readers(ROOT)
    assert len(readers) <= CONFIG_FILES_CEILING, sorted(readers)
    # the evaluation, the tabulation, the space and the storage measure and store candidates: they take the values
    # they need, never the config
    below_the_engine = ("_evaluation", "_tabulation", "_space", "_storage")
    assert not [f for f in readers if any(f"search/{part}" in f for part in below_the_engine)], sorted(readers)
