"""docs/reference.md lists every registered pooler and post-processor with its formula and paper, and every built-in
recipe with its configs and method, and is up to date."""

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
    recipes = committed.split("## Recipes", 1)[1]
    for name in ("promptbert_unsup", "cotbert_unsup", "pcc_tuning", "llm2vec_contrastive"):
        assert f"| `{name}` |" in recipes
    assert "| `pcc_tuning` | `lightning_modules.pcc_tuning.PccTuning` | `model=pcc_tuning` | `pcc_tuning`, " \
           "`quickstart_pcc_tuning_smollm2` | Pcc-tuning's second stage (Zhang & Li, EMNLP 2024" in recipes


def test_a_users_recipe_stays_out_of_the_reference(monkeypatch):
    """The reference lists the package's recipes only, whatever else the process registered."""
    from promptemb.lightning_modules.promptbert import PromptBERTUnsup

    mine = type("MyRecipe", (PromptBERTUnsup,), {"__module__": "my_recipes"})
    monkeypatch.setattr(component_reference, "RECIPES", {**component_reference.RECIPES, "my_recipe": mine})
    assert "my_recipe" not in component_reference.render()


def test_the_recipe_table_does_not_depend_on_the_order_recipes_were_imported(monkeypatch):
    """Recipes register as their modules are imported, in an order that varies between processes."""
    component_reference.register_builtin_recipes()
    committed = component_reference.DEFAULT_OUTPUT.read_text(encoding="utf-8")
    monkeypatch.setattr(component_reference, "RECIPES", dict(reversed(list(component_reference.RECIPES.items()))))
    assert component_reference.render() == committed

