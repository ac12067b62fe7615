"""The JSON Schema describes what the loader accepts: shipped specs, README/docs examples, shorthands.

Checked with the independent ``jsonschema`` validator (Draft 2020-12), against the loader itself.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import pytest
import yaml

from archspec.cli import main
from archspec.errors import SpecError
from archspec.ir.checked import load_spec
from archspec.spec import SPEC_DIR, shipped_specs
from archspec.spec.schema import SCHEMA_FILE_NAME, spec_schema

ROOT = Path(__file__).resolve().parent.parent
VALIDATOR = jsonschema.Draft202012Validator(spec_schema())


def _errors(document) -> list[str]:
    return [e.message for e in VALIDATOR.iter_errors(document)]


def _yaml_blocks() -> list[tuple[str, str]]:
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    return [(f"{path.name}#{k}", block) for path in docs
            for k, block in enumerate(re.findall(r"```ya?ml\n(.*?)```", path.read_text(encoding="utf-8"), re.S))]


def test_schema_is_draft_2020_12_with_id() -> None:
    schema = spec_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema" and schema["$id"]


def test_checked_in_schema_equals_archspec_schema(capsys) -> None:
    assert main(["schema"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == json.loads((SPEC_DIR / SCHEMA_FILE_NAME).read_text(encoding="utf-8")), \
        "run: archspec schema > specs/archspec.schema.json"


@pytest.mark.parametrize("name", shipped_specs())
def test_shipped_spec_validates_and_names_the_schema(name: str) -> None:
    text = (SPEC_DIR / f"{name}.yaml").read_text(encoding="utf-8")
    assert text.splitlines()[0] == f"# yaml-language-server: $schema={SCHEMA_FILE_NAME}"
    assert _errors(yaml.safe_load(text)) == []


def test_readme_and_docs_yaml_blocks_validate_and_load() -> None:
    blocks = _yaml_blocks()
    assert blocks, "the README has a spec example"
    for where, block in blocks:
        assert _errors(yaml.safe_load(block)) == [], where
        load_spec(block)


SHORTHANDS = """\
x-stage: &stage {depth: 2, dim: 64, heads: 4, mlp_ratio: 2}
input: {resolution: 64}
stem: {kind: patch, patch_size: 16}
tokens: {cls_token: false}
head: {pool: mean}
stages:
  - <<: *stage
    drop_path: [0, 0.1]
    attention: mask:5x3
    layers:
      - {range: 0, heads: [mhsa, " soft_mask:3x3 ", {mask: {window: 3, mode: strict}}, {gpsa: {}, rel_bias: {}}]}
      - {range: "1-1", mixer: token_conv5}
"""


def test_every_shorthand_the_loader_accepts_validates() -> None:
    spec = load_spec(SHORTHANDS)
    assert spec.stages[0].attention.mask.window == (5, 3) and spec.input.resolution == (64, 64)
    assert _errors(yaml.safe_load(SHORTHANDS)) == []
    with_token = {"tokens": {"cls_token": True}, "stages": [{"depth": 1, "dim": 64, "heads": 2}]}
    assert load_spec(with_token).tokens.cls_token == "input" and _errors(with_token) == []


INVALID = {
    "unknown key": "stages: [{depth: 2, dim: 64, heads: 2, dpeth: 3}]",
    "string resolution": "input: {resolution: 224px}\nstages: [{depth: 2, dim: 64, heads: 2}]",
    "bad head kind": "stages: [{depth: 2, dim: 64, heads: 2, attention: msk}]",
    "window on a plain head": "stages: [{depth: 2, dim: 64, heads: 2, attention: 'mhsa:3x3'}]",
    "bad range": "stages: [{depth: 2, dim: 64, heads: 2, layers: [{range: 0..1, attention: mhsa}]}]",
    "no stages": "input: {resolution: 64}",
    "stem without kind": "stem: {patch_size: 8}\nstages: [{depth: 2, dim: 64, heads: 2}]",
    "bad mixer": "stages: [{depth: 2, dim: 64, heads: 2, mixer: mlp}]",
    "bool depth": "stages: [{depth: true, dim: 64, heads: 2}]",
    "non-x top-level key": "y-anchor: 1\nstages: [{depth: 2, dim: 64, heads: 2}]",
}


@pytest.mark.parametrize("case", sorted(INVALID))
def test_invalid_specs_fail_schema_and_loader(case: str) -> None:
    text = INVALID[case]
    assert _errors(yaml.safe_load(text)), case
    with pytest.raises(SpecError):
        load_spec(text, check=False)


def test_did_you_mean_only_suggests_keys_of_that_place() -> None:
    with pytest.raises(SpecError) as info:
        load_spec("stages: [{depth: 2, dim: 64, heads: 2, attention: {mask: {size: 3}}}]", check=False)
    problem = info.value.problems[0]
    assert "stride" not in problem.hint and "window" in problem.hint
    with pytest.raises(SpecError) as info:
        load_spec("stages: [{depth: 2, dim: 64, heads: 2, attention: {mask: {windw: 3}}}]", check=False)
    assert info.value.problems[0].hint == "did you mean 'window'?"


def test_table_prints_the_head_letter_legend(capsys) -> None:
    assert main(["validate", "convit_tiny"]) == 0
    out = capsys.readouterr().out
    assert "P P P P" in out and "A A A A" in out and "P GPSA" in out and "A plain MHSA" in out


# ------------------------------------------------------------------------------------------- search spaces
@pytest.mark.slow
def test_space_schema_accepts_shipped_and_documented_spaces(capsys) -> None:
    import textwrap

    from search_fixtures import TINY_SPACE

    from archspec.search._space import language as space
    from archspec.search._space.language import SPACES_DIR, load_space
    from archspec.spec.schema import SPACE_SCHEMA_FILE_NAME, space_schema

    schema = space_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)
    assert main(["schema", "--space"]) == 0
    assert json.loads(capsys.readouterr().out) == json.loads((SPACES_DIR / SPACE_SCHEMA_FILE_NAME).read_text())
    example = textwrap.dedent(re.search(r"Example::\n\n(.*)$", space.__doc__, re.S).group(1))
    for path in sorted(SPACES_DIR.glob("*.yaml")):
        text = path.read_text(encoding="utf-8")
        assert text.splitlines()[0] == f"# yaml-language-server: $schema={SPACE_SCHEMA_FILE_NAME}"
        assert list(validator.iter_errors(yaml.safe_load(text))) == [], path.name
    for document in (TINY_SPACE, yaml.safe_load(example)):
        load_space(document)
        assert list(validator.iter_errors(document)) == []
    bad = [{"spec": {"stages": [{"depth": {"int": [1]}, "dim": 64, "heads": 2}]}},       # range without high
           {"spec": {"stages": [{"depth": {"int": [1, 2], "choice": [1]}, "dim": 64, "heads": 2}]}},
           {"spec": {"stages": {"count": 1}}},                                              # no items
           {"spec": {"stages": [{"depth": 1, "dim": 64, "heads": 2}]}, "kind": "other"},
           {"spec": {"stages": [{"depth": 1, "dim": 64, "heads": 2, "heads_mix": {"masked": 1}}]}}]
    for document in bad:
        assert list(validator.iter_errors(document)), document
        with pytest.raises(SpecError):
            load_space(document)


def test_top_level_unknown_key_mentions_x_prefix() -> None:
    with pytest.raises(SpecError) as info:
        load_spec("anchors: {a: 1}\nstages: [{depth: 2, dim: 64, heads: 2}]", check=False)
    assert "'x-'" in info.value.problems[0].hint


def test_a_stage_may_name_its_kind() -> None:
    """``kind: attention`` (the default, which the loader accepts) and ``kind: conv`` validate; others do not."""
    base = yaml.safe_load((SPEC_DIR / "deit_tiny.yaml").read_text(encoding="utf-8"))
    named = {**base, "stages": [{**base["stages"][0], "kind": "attention"}]}
    assert _errors(named) == [] and load_spec(named).stages == load_spec(base).stages
    assert _errors({**base, "stages": [{**base["stages"][0], "kind": "pooling"}]})
    resnet = yaml.safe_load((SPEC_DIR / "resnet18.yaml").read_text(encoding="utf-8"))
    assert _errors(resnet) == [] and _errors({**resnet, "stem": {k: v for k, v in resnet["stem"].items()
                                                                 if k != "kind"}})
