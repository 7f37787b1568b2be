"""docs/reference.md lists every registered pooler and post-processor with its formula and paper, and is up to date."""

from __future__ import annotations

from promptemb.poolers.registry import PAPERS as POOLER_PAPERS
from promptemb.research import component_reference


def test_every_registered_name_has_a_formula_and_a_paper():
    assert component_reference.missing_entries() == []


def test_a_name_without_a_paper_is_reported(monkeypatch):
    monkeypatch.delitem(POOLER_PAPERS, "ditto")
    assert component_reference.missing_entries() == ["pooler ditto: no paper"]


def test_the_committed_reference_is_generated_from_the_registries():
    committed = component_reference.DEFAULT_OUTPUT.read_text(encoding="utf-8")
    assert committed == component_reference.render(), "run python -m promptemb.research.component_reference"
    for name in (*component_reference.POOLERS, *component_reference.POSTS):
        assert f"| `{name}` |" in committed
