"""Every config key type- and range-checked, devices, paths, weights and data columns verified before any model or
data is loaded: one `error:` line, exit code 2, nothing left behind (train.py and evaluate.py as users run them)."""

import os
import re
import shutil
import subprocess
import sys
import types
import typing
from pathlib import Path

import pytest
import torch

from promptemb.common.bounds import AtLeastOne
from promptemb.common.errors import ConfigError, DataError
from promptemb.common.hydra_bridge import plain
from promptemb.common.validation import check_value
from promptemb.evaluation.settings import EvaluateSettings
from tests.conftest import REPO
from tests.helpers import assert_one_line_error
from tests.training.test_train import WIKI_SAMPLE, checked, compose_train

NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a machine without CUDA")


def run(script, *overrides, cwd=REPO, data_root=None):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled"}
    if data_root is not None:
        env["PROMPTEMB_DATA"] = str(data_root)
    return subprocess.run([sys.executable, str(REPO / script), *overrides], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)




@pytest.fixture(scope="module")
def truncated_bert(tiny_bert, tmp_path_factory) -> Path:
    """A copy of the tiny BERT whose model.safetensors lost its second half (an interrupted download)."""
    directory = tmp_path_factory.mktemp("truncated") / "model"
    shutil.copytree(tiny_bert, directory)
    weights = directory / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    return directory


@pytest.fixture()
def no_hard_negatives(tmp_path) -> Path:
    path = tmp_path / "nli.csv"
    path.write_text("sent0,sent1\n" + "a man plays a guitar,a person plays music\n" * 8)
    return path


def train_overrides(tiny_bert, out, *extra):
    return ["experiment=quickstart_unsup", f"backbone.name_or_path={tiny_bert}", f"output_dir={out}",
            "trainer.accelerator=cpu", "data.download=null", f"data.files=[{WIKI_SAMPLE}]", "data.max_examples=64",
            *extra]


# -- train.py, one subprocess per class of mistake -------------------------------------------------------------


@pytest.mark.parametrize("override, pattern", [
    ("data.batch_size=abc", r"^error: data\.batch_size='abc': Input should be a valid integer$"),
    ("model.temperature=0", r"^error: model\.temperature=0: Input should be greater than 0$"),
    ("trainer.precision=bf16-mixd", r"^error: trainer\.precision='bf16-mixd': Input should be 64, 32, 16, "
                                    r".*'bf16-mixed', '32-true'"),
    ("data.files=[no/such/corpus.txt]", r"^error: data\.files: corpus file .*no/such/corpus\.txt does not exist "
                                        r"\(relative paths are relative to the data root"),
    pytest.param("trainer.accelerator=gpu", r"^error: trainer\.accelerator=gpu but this machine has no CUDA GPU",
                 marks=NO_CUDA),
])
def test_train_bad_value_is_one_line_and_leaves_no_run_folder(override, pattern, tiny_bert, real_data_root,
                                                               tmp_path):
    out = tmp_path / "run"
    proc = run("train.py", *train_overrides(tiny_bert, out, override), data_root=real_data_root)
    assert_one_line_error(proc, pattern, out)


def test_train_truncated_weights_name_the_file(truncated_bert, real_data_root, tmp_path):
    out = tmp_path / "run"
    proc = run("train.py", *train_overrides(truncated_bert, out), data_root=real_data_root)
    assert_one_line_error(proc, rf"^error: model weights {re.escape(str(truncated_bert / 'model.safetensors'))} are "
                                r"truncated or corrupt \(.*\); download or save the model again$", out)


def test_supervised_csv_without_hard_negatives_fails_before_the_model_loads(tiny_bert, real_data_root, tmp_path,
                                                                           no_hard_negatives):
    out = tmp_path / "run"
    proc = run("train.py", "experiment=quickstart_sup", f"backbone.name_or_path={tiny_bert}", f"output_dir={out}",
               "data.format=nli_csv", f"data.file={no_hard_negatives}", data_root=real_data_root)
    assert_one_line_error(proc, r"nli\.csv: missing column\(s\) hard_neg; expected a header sent0,sent1,hard_neg", out)
    assert "LOAD REPORT" not in proc.stderr and "Loading weights" not in proc.stderr  # no model was loaded


def test_train_unwritable_output_dir(tiny_bert, real_data_root, tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    proc = run("train.py", *train_overrides(tiny_bert, blocker / "run"), data_root=real_data_root)
    assert_one_line_error(proc, r"^error: output_dir='.*a_file/run' cannot be created: .*a_file is a file, not a "
                                r"directory$")
    assert blocker.read_text() == ""


# -- evaluate.py ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("override, pattern", [
    ("backbone.batch_size=abc", r"^error: backbone\.batch_size='abc': Input should be a valid integer$"),
    ("backbone.dtype=float8", r"^error: backbone\.dtype='float8': Input should be 'float32', 'bfloat16' or "
                              r"'float16'$"),
    pytest.param("backbone.device=cuda", r"^error: backbone\.device=cuda but this machine has no CUDA GPU",
                 marks=NO_CUDA),
    # accepted and then without effect on a local model: a hub revision, the export-only weights override
    ("backbone.revision=v2", r"^error: backbone\.revision=v2 selects a version of a Hugging Face Hub model, but "
                             r".* is local: drop backbone\.revision$"),
    ("allow_unverified_weights=true", r"^error: allow_unverified_weights=true applies to an export folder .* is a "
                                      r"pretrained model: drop it$"),
])
def test_evaluate_bad_value_is_one_line_and_leaves_nothing(override, pattern, tiny_bert, real_data_root, tmp_path):
    out = tmp_path / "out"
    proc = run("evaluate.py", f"backbone.name_or_path={tiny_bert}", f"output_dir={out}", override, cwd=tmp_path,
               data_root=real_data_root)
    assert_one_line_error(proc, pattern, out, tmp_path / "logs")


def test_evaluate_truncated_weights_and_unwritable_output(truncated_bert, tiny_bert, real_data_root, tmp_path):
    out = tmp_path / "out"
    proc = run("evaluate.py", f"backbone.name_or_path={truncated_bert}", f"output_dir={out}", cwd=tmp_path,
               data_root=real_data_root)
    assert_one_line_error(proc, r"^error: model weights .*model\.safetensors are truncated or corrupt", out,
                          tmp_path / "logs")
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    proc = run("evaluate.py", f"backbone.name_or_path={tiny_bert}", f"output_dir={blocker / 'out'}", cwd=tmp_path,
               data_root=real_data_root)
    assert_one_line_error(proc, r"^error: output_dir='.*a_file/out' cannot be created", tmp_path / "logs")


@pytest.mark.slow
def test_evaluate_keeps_hydra_files_in_the_run_folder_not_the_cwd(tiny_bert, mini_data, tmp_path):
    """A scoring run's Hydra files go inside output_dir; an encode run (its output is a file) leaves no folder."""
    root, registry = mini_data
    tmp_path = tmp_path / "cwd"
    tmp_path.mkdir()
    out = tmp_path / "out"
    proc = run("evaluate.py", f"backbone.name_or_path={tiny_bert}", f"output_dir={out}", "tasks=[MINI-B]",
               f"task_registry={registry}", "progress=false", cwd=tmp_path, data_root=root)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert {".hydra", "evaluate.log", "results.json"} <= {p.name for p in out.iterdir()}
    (tmp_path / "in.txt").write_text("a man is playing a guitar .\n")
    proc = run("evaluate.py", "mode=encode", f"backbone.name_or_path={tiny_bert}", f"input={tmp_path / 'in.txt'}",
               f"output={tmp_path / 'emb.npy'}", "progress=false", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["emb.npy", "emb.npy.json", "in.txt", "out"]


# -- the checks themselves, in process (every key class, no subprocess) ---------------------------------------------


@pytest.mark.parametrize("override, message", [
    ("data.batch_size=0", "data.batch_size=0: Input should be greater than or equal to 1"),
    ("data.batch_size=2.5", "data.batch_size=2.5: Input should be a valid integer"),
    ("data.batch_size=true", "data.batch_size=True: Input should be a valid integer"),
    ("data.num_workers=-1", "data.num_workers=-1: Input should be greater than or equal to 0"),
    ("optimizer.lr=0", "optimizer.lr=0: Input should be greater than 0"),
    ("optimizer.lr=fast", "optimizer.lr='fast': Input should be a valid number"),
    ("scheduler.warmup_ratio=1.5", "scheduler.warmup_ratio=1.5: Input should be less than or equal to 1"),
    ("optimizer.weight_decay=-1", "optimizer.weight_decay=-1: Input should be greater than or equal to 0"),
    ("template.sentence_rule=x", "template.sentence_rule='x': Input should be 'none', 'append_period',"),
    ("template=promptbert_bert", "PromptBERTUnsup trains with a pair of templates (template.text, "
                                 "template.second_text) but the template config gives one template; valid here: "
                                 "template="),
    ("model.max_sentence_tokens=0", "model.max_sentence_tokens=0: Input should be greater than or equal to 1"),
    ("model.sentence_rule=promptbert_v2", "model.sentence_rule='promptbert_v2': Input should be 'none', "
                                           "'append_period', 'promptbert'"),
    ("model.denoise=maybe", "model.denoise='maybe': Input should be a valid boolean"),
    ("eval_every_n_steps=0", "eval_every_n_steps=0: Input should be greater than or equal to 1"),
    ("seed=-1", "seed=-1: Input should be greater than or equal to 0"),
    ("seed=4294967296", "seed=4294967296: Input should be less than or equal to 4294967295"),
    ("trainer.max_steps=many", "trainer.max_steps='many': Input should be a valid integer"),
    ("trainer.gradient_clip_val=-1.0", "trainer.gradient_clip_val=-1.0: Input should be greater than or equal to 0"),
    ("trainer.accelerator=tpuu", "trainer.accelerator='tpuu': Input should be 'auto', 'cpu'"),
    ("callbacks.sts_evaluation.every_n_steps=0", "callbacks.sts_evaluation.every_n_steps=0: Input should be greater "
                                                 "than or equal to 1"),
    ("+model.learning_rate=1e-3", "model.learning_rate is not a parameter of PromptBERTUnsup; valid: "),
    ("+extras.print_configs=true", "extras.print_configs is not a key of the extras group; did you mean "
                                   "extras.print_config?"),
    ("extras.print_config=yes", "extras.print_config='yes': Input should be a valid boolean"),
    ("paths.log_dir=null", "paths.log_dir=None: Input should be a valid string"),
    ("+template.texts=x", "template.texts is not a key of a template option; did you mean template.text?"),
])
def test_every_key_class_is_checked_before_loading(override, message, tiny_bert, real_data_root, tmp_path):
    cfg = compose_train([*train_overrides(tiny_bert, tmp_path / "run", override), f"data_root={real_data_root}"])
    with pytest.raises(ConfigError, match=re.escape(message)):
        checked(cfg)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("overrides, message", [
    (["experiment=quickstart_unsup", "model.denoise=false", "model.freeze_bias=true"],
     "model.freeze_bias=true stops the gradient through the template bias that denoising subtracts; with "
     "model.denoise=false there is none: drop model.freeze_bias"),
    (["experiment=quickstart_sup", "model.denoise=false"],
     "model.denoise=False: Input should be True"),
])
def test_recipe_settings_that_would_change_nothing_are_refused(overrides, message, tiny_bert, real_data_root,
                                                               tmp_path):
    """A recipe setting accepted and then without effect (no template bias to freeze without denoising; the
    supervised recipe always denoises) is refused by the config check, before the recipe is built."""
    cfg = compose_train([*overrides, f"backbone.name_or_path={tiny_bert}", f"data_root={real_data_root}",
                         f"output_dir={tmp_path / 'run'}"])
    with pytest.raises(ConfigError, match=f"^{re.escape(message)}$"):
        checked(cfg)
    assert not (tmp_path / "run").exists()


def test_published_and_quickstart_recipes_pass_the_checks(tiny_bert, real_data_root, tmp_path):
    for name in ("promptbert_unsup", "promptbert_sup", "optiprompt", "quickstart_unsup", "quickstart_sup",
                 "quickstart_optiprompt"):
        checked(compose_train([f"experiment={name}", f"data_root={real_data_root}",
                               f"output_dir={tmp_path / name}"]))
    assert not list(tmp_path.iterdir())  # checking creates nothing


def test_missing_nli_column_is_found_without_reading_the_rows(tmp_path, real_data_root, no_hard_negatives):
    cfg = compose_train(["experiment=quickstart_sup", f"data_root={real_data_root}", f"output_dir={tmp_path / 'o'}",
                         "data.format=nli_csv", f"data.file={no_hard_negatives}"])
    with pytest.raises(DataError, match=r"missing column\(s\) hard_neg"):
        checked(cfg)


def test_evaluate_checks_in_process(tiny_bert, tmp_path):
    from hydra import compose, initialize_config_dir

    def evaluate_cfg(*overrides):
        with initialize_config_dir(str(REPO / "configs"), version_base="1.3"):
            return compose("eval", overrides=[f"backbone.name_or_path={tiny_bert}",
                                                  f"output_dir={tmp_path / 'out'}", *overrides])

    EvaluateSettings.model_validate(plain(evaluate_cfg()))
    for override, message in [("backbone.max_length=0", "backbone.max_length=0: Input should be greater than or "
                                                        "equal to 3"),
                              ("max_sentence_tokens=-2", "max_sentence_tokens=-2: Input should be greater than or "
                                                         "equal to 1"),
                              ("backbone.device=gpu0", "backbone.device='gpu0' is not a device"),
                              ("analysis=yes", "analysis='yes': Input should be a valid boolean"),
                              (f"task_registry={tmp_path / 'none.yaml'}", "task_registry="),
                              ("+backbone.foo=1", "backbone.foo is not a parameter of Encoder")]:
        with pytest.raises(ConfigError, match=re.escape(message)):
            EvaluateSettings.model_validate(plain(evaluate_cfg(override)))
    assert not (tmp_path / "out").exists()


def test_pydantic_says_what_is_wrong_in_the_one_line_frame():
    check_value("trainer.devices", [0, 1], list[int] | str | int)
    with pytest.raises(ConfigError, match=r"^x\.files=\[1\]: Input should be a valid string$"):
        check_value("x.files", [1], list[str])
    with pytest.raises(ConfigError, match=r"^x\.devices=1\.5: Input should be a valid list, a valid string or a "
                                          r"valid integer$"):
        check_value("x.devices", 1.5, list[int] | str | int)
    with pytest.raises(ConfigError, match=r"^x\.size=0: Input should be greater than or equal to 1$"):
        check_value("x.size", 0, AtLeastOne | None)


def test_declared_hints_name_parameters_their_owner_takes(monkeypatch):
    """`declare_hints` bounds for classes we do not own (AdamW, Lightning's Trainer and ModelCheckpoint): each name
    is a parameter of that class, so a misspelt declaration cannot silently check nothing."""
    import promptemb.lightning_modules.base  # declares AdamW's
    import promptemb.training.checkpointing
    import promptemb.training.trainer  # noqa: F401
    from promptemb.common.validation import DECLARED_HINTS, parameter_hints

    assert {owner.__name__ for owner in DECLARED_HINTS} >= {"AdamW", "Trainer", "RunCheckpoint"}
    for owner, declared in list(DECLARED_HINTS.items()):
        monkeypatch.delitem(DECLARED_HINTS, owner)
        own = parameter_hints(owner)[0]
        monkeypatch.setitem(DECLARED_HINTS, owner, declared)
        assert set(declared) <= set(own), (owner, set(declared) - set(own))
        for name, hint in declared.items():
            assert parameter_hints(owner)[0][name] is hint
            arms = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
            assert any(typing.get_origin(arm) in (typing.Annotated, typing.Literal) for arm in arms), (owner, name)


@pytest.mark.parametrize("value, where", [(float("nan"), ""), ([1.0, float("inf")], " (at 1)"),
                                          ({"a": {"b": -float("inf")}}, " (at a.b)")])
def test_a_non_finite_number_is_refused_at_any_depth(value, where):
    """An open map's keys are checked by their owners when they build; its numbers are checked here, at any depth."""
    with pytest.raises(ConfigError, match=rf"^k=.*: Input should be a finite number{re.escape(where)}$"):
        check_value("k", value)
    check_value("k", {"a": [1.0, {"b": 2}], "c": "nan"})  # finite numbers and strings pass


def test_open_maps_refuse_a_non_finite_number_before_any_work():
    from promptemb.common.hydra_bridge import compose
    from promptemb.common.validation import COMPOSITION

    with pytest.raises(ConfigError, match=r"^pooler_args=\{'contrastive_prompting': \{'coeff': nan\}\}: Input should "
                                          r"be a finite number \(at contrastive_prompting.coeff\)$"):
        EvaluateSettings.model_validate(compose("eval", ["+pooler_args.contrastive_prompting.coeff=nan"]),
                                        context=COMPOSITION)
    with pytest.raises(ConfigError, match=r"^callbacks.sts_evaluation.pooler_args=.*: Input should be a finite "
                                          r"number \(at ditto.head\)$"):
        checked(compose_train(["experiment=quickstart_unsup", "+callbacks.sts_evaluation.pooler_args.ditto.head=inf"]))
