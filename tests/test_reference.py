"""The committed field reference is the generated one (it cannot drift from the schema)."""

from pathlib import Path

from archspec.spec.reference import markdown


def test_docs_spec_reference_is_current() -> None:
    committed = (Path(__file__).resolve().parent.parent / "docs" / "spec-reference.md").read_text(encoding="utf-8")
    assert committed.strip() == markdown().strip(), "run: archspec schema --markdown > docs/spec-reference.md"
