"""Registration by name (recipes, poolers): a user's component joins the built-ins under a name of its own; a taken
name, a module that does not import and a checkpoint of an unregistered recipe are refused in one line."""

from __future__ import annotations

import sys

import pytest

from promptemb.common.errors import ConfigError, DataError
from promptemb.common.plugins import import_modules
from promptemb.common.registry import Registry
from promptemb.lightning_modules.promptbert import PromptBERTUnsup
from promptemb.lightning_modules.recipe import (
    RECIPES,
    recipe_of_checkpoint,
    register_recipe,
    require_registered,
)
from promptemb.poolers import POOLERS, build_pooler, register_pooler
from promptemb.poolers.mean import MeanPooler


def test_a_builtin_name_cannot_be_taken():
    class Mine(PromptBERTUnsup):
        pass

    with pytest.raises(ConfigError, match=r"Mine cannot be registered as the built-in recipe 'promptbert_unsup'; "
                                          r"register it under another name$"):
        register_recipe("promptbert_unsup")(Mine)
    with pytest.raises(ConfigError, match=r"cannot be registered as the built-in pooler 'mean'"):
        register_pooler("mean")(type("MeanToo", (MeanPooler,), {}))
    assert RECIPES["promptbert_unsup"] is PromptBERTUnsup and POOLERS["mean"][0] is MeanPooler


def test_a_users_pooler_is_built_by_name_with_its_arguments():
    @register_pooler("test_registry_mean_of_layer", layers=(1,))
    class LayerMean(MeanPooler):
        pass

    pooler = build_pooler("test_registry_mean_of_layer")
    assert isinstance(pooler, LayerMean) and pooler.layers == (1,) and pooler.name == "test_registry_mean_of_layer"
    register_pooler("test_registry_mean_of_layer", layers=(1,))(LayerMean)  # the same class again: no change


def test_two_components_cannot_share_a_name():
    registry = Registry("widget", "nowhere", "register it")
    registry.register("w", int)
    registry.register("w", int)  # the same owner (its module imported twice)
    with pytest.raises(ConfigError, match=r"builtins\.float cannot be registered as widget 'w', taken by "
                                          r"builtins\.int; register it under another name"):
        registry.register("w", float)
    with pytest.raises(ConfigError, match=r"name 'not an identifier' must be an identifier"):
        registry.register("not an identifier", float)


def test_an_unregistered_recipe_class_is_refused_before_training():
    class Unnamed(PromptBERTUnsup):
        pass

    with pytest.raises(ConfigError, match=r"^model\._target_=.*Unnamed is not a registered recipe, so its checkpoints "
                                          r"could not be loaded: decorate the class with @register_recipe"):
        require_registered(Unnamed)
    assert require_registered(PromptBERTUnsup) == "promptbert_unsup"


@pytest.mark.parametrize(("record", "message"), [
    ({"name": "my_simcse", "class": "my_recipes.MySimCSE"},
     r"was trained by recipe 'my_simcse' \(my_recipes\.MySimCSE\), which is not registered in this process: pass "
     r"imports=\[my_recipes\] \(the module that registers it\)"),
    ({"name": None, "class": "my_recipes.Unnamed"}, r"was written by my_recipes\.Unnamed, which was not a registered "
                                                    r"recipe; decorate it with @register_recipe"),
    (None, r"records no recipe; pass a \.ckpt written by train\.py"),
])
def test_a_checkpoint_of_an_unknown_recipe_is_refused_without_importing_it(record, message):
    checkpoint = {"state_dict": {}, "hyper_parameters": {}, **({"promptemb_recipe": record} if record else {})}
    with pytest.raises(DataError, match=message):
        recipe_of_checkpoint(checkpoint, "run/last.ckpt")
    assert "my_recipes" not in sys.modules


def test_user_modules_import_or_say_why_in_one_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the current directory is searched, as `python -m` does
    (tmp_path / "registry_test_good.py").write_text("VALUE = 1\n")
    (tmp_path / "registry_test_broken.py").write_text("import definitely_not_installed_xyz\n")
    import_modules(["registry_test_good"])
    assert sys.modules["registry_test_good"].VALUE == 1
    with pytest.raises(ConfigError, match=r"^imports=\[registry_test_missing\]: the module failed to import: "
                                          r"ModuleNotFoundError: No module named 'registry_test_missing'$"):
        import_modules(["registry_test_missing"])
    with pytest.raises(ConfigError, match=r"^imports=\[registry_test_broken\]: the module failed to import \(an error "
                                          r"inside it\): ModuleNotFoundError: No module named "):
        import_modules(["registry_test_broken"])
    with pytest.raises(ConfigError, match=r"a module name such as my_recipes"):
        import_modules(["some/path.py"])


def test_a_builtin_recipes_checkpoint_is_recognised_in_a_fresh_process(tmp_path):
    """`evaluate.py`, `export.py` and `load_encoder` read a checkpoint in a process that imported no recipe module:
    the built-in recipes are registered when a checkpoint is read, with no `imports=`."""
    import subprocess

    code = ("from promptemb.lightning_modules.recipe import recipe_of_checkpoint; "
            "print(recipe_of_checkpoint({'promptemb_recipe': {'name': 'prompteol_sup', "
            "'class': 'promptemb.lightning_modules.prompteol.PromptEOLSup'}}, 'x.ckpt').__name__)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "PromptEOLSup"
