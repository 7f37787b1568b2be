"""Fault injection, values and keys: non-finite numbers, keys that would be accepted and then ignored, misspelt
keys and group options. Each ends the entry point in one `error:` line (with the closest valid name where there is
one), exit status 2, no traceback, and no run folder left behind."""

from __future__ import annotations

import math
import re
import types
import typing

import pytest
import torch

from promptemb.common.errors import ConfigError
from promptemb.common.validation import check_node, check_value, parameter_hints
from promptemb.exporting.command_line import check_export_command
from promptemb.inference.command_line import check_evaluate_command
from promptemb.lightning_modules.promptbert import PromptBERTUnsup
from promptemb.lightning_modules.schedules import linear_warmup_decay
from promptemb.training.command_line import check_train_command
from promptemb.training.settings import declare_optimizer_hints
from promptemb.training.trainer import Trainer
from tests.faults import listing, run_entry
from tests.helpers import assert_one_line_error
from tests.run_faults import fast_overrides, train_py


def check_command_line(entry: str, argv: list[str]):
    """The entry point's check of its command line (composed once, checked: the composition alone)."""
    if entry == "train":
        return check_train_command(argv, composition_only=True)
    if entry == "export":
        return check_export_command(argv, composition_only=True)
    return check_evaluate_command(argv, entry, composition_only=True)


declare_optimizer_hints()  # train.py declares AdamW's ranges as its check runs; these tests check AdamW directly
#: where each key's range is declared: its owner's hints
OWNERS = {"optimizer": torch.optim.AdamW, "model": PromptBERTUnsup, "scheduler": linear_warmup_decay,
          "trainer": Trainer}


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("key", ["optimizer.lr", "model.temperature", "scheduler.warmup_ratio",
                                 "trainer.gradient_clip_val", "optimizer.weight_decay"])
def test_non_finite_numbers_fail_every_range_check(key, value):
    group, name = key.split(".")
    hint = parameter_hints(OWNERS[group])[0][name]
    arms = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    assert any(typing.get_origin(arm) is typing.Annotated for arm in arms)  # a range is declared
    with pytest.raises(ConfigError, match=rf"^{re.escape(key)}={value!r}: Input should be a finite number$"):
        check_node(f"{group}.", {name: value}, OWNERS[group])


def test_non_finite_numbers_fail_even_where_no_range_is_declared():
    with pytest.raises(ConfigError, match=r"^pooler_args\.whatever\.scale=nan: Input should be a finite number$"):
        check_value("pooler_args.whatever.scale", math.nan, float)


@pytest.mark.parametrize(("entry", "argv", "pattern"), [
    ("evaluate", ["poolerz=[mask]"], r"^'poolerz' is not a key of evaluate\.py's config; did you mean 'poolers'\?"),
    ("evaluate", ["poolerz=mask"], r"did you mean 'poolers'\?"),
    ("evaluate", ["backbone=bert_larg"], r"^evaluate\.py: there is no backbone 'bert_larg' .*did you mean "
                                         r"bert_base\? valid: bert_base, decoder, minilm, roberta_base$"),
    ("encode", ["poolr=mask"], r"'poolr' is not a key of promptemb-encode's config; did you mean 'pooler'\?"),
    ("train", ["backbone=bert_larg"], r"^train\.py: there is no backbone 'bert_larg' .*did you mean bert_base"),
    ("train", ["template=promptbert_bertt"], r"there is no template 'promptbert_bertt' .*did you mean "
                                             r"promptbert_bert"),
    ("train", ["trainer.max_step=3"], r"did you mean 'trainer\.max_steps'\?"),
    ("export", ["ckpt_paths=a.ckpt"], r"^'ckpt_paths' is not a key of export\.py's config; did you mean "
                                      r"'ckpt_path'\?"),
    # score and encode are two commands with a config each (eval.yaml, encode.yaml): a key of the other is unknown
    ("evaluate", ["pooler=mask"], r"^'pooler' is not a key of evaluate\.py's config; did you mean 'poolers'\? "),
    ("evaluate", ["input=a.txt"], r"^'input' is not a key of evaluate\.py's config"),
    ("encode", ["mode=encode", "poolers=[mask]"], r"^'poolers' is not a key of promptemb-encode's config; did you mean "
                                                  r"'pooler'\? "),
    ("encode", ["analysis=true"], r"^'analysis' is not a key of promptemb-encode's config"),
    ("train", ["backbone.max_length=8"], r"^train\.py does not read backbone\.max_length .*set "
                                         r"\+model\.max_length=N"),
    ("train", ["backbone.dtype=bfloat16"], r"^train\.py does not read backbone\.dtype .*trainer\.precision"),
    ("train", ["trainer.num_sanity_val_steps=2"], r"^train\.py does not read trainer\.num_sanity_val_steps: there is "
                                                   r"no validation loop; drop it$"),
    ("train", ["trainer.default_root_dir=/tmp/x"], r"^train\.py does not read trainer\.default_root_dir: checkpoints "
                                                   r"and logs have their own folders under output_dir"),
    ("train", ["logger.resume_step=5"], r"^train\.py does not read logger\.resume_step: a resumed run sets it"),
    ("train", ["expected_scores.best_dev=80"], r"^train\.py does not read expected_scores\.best_dev: `make "
                                               r"reproduce` reads the pinned scores from the experiment's file"),
])
def test_command_line_mistakes_are_one_line_with_the_closest_name(entry, argv, pattern, tmp_path):
    with pytest.raises(ConfigError) as refused:
        check_command_line(entry, [*argv, f"output_dir={tmp_path / 'out'}"] if entry != "export" else argv)
    assert "\n" not in str(refused.value)
    assert re.search(pattern, str(refused.value)), str(refused.value)
    assert listing(tmp_path) == []


def test_what_each_mode_reads_is_still_accepted(tmp_path):
    check_command_line("evaluate", ["poolers=[mask]", f"output_dir={tmp_path / 'o'}"])
    check_command_line("encode", ["mode=encode", "pooler=mask", "input=a.txt"])
    check_command_line("encode", ["pooler=mask"])
    check_command_line("train", ["backbone=minilm", "backbone.name_or_path=x", "+model.max_length=64"])


@pytest.mark.parametrize(("script", "argv", "pattern"), [
    ("evaluate.py", ["poolerz=[mask]"], r"^error: 'poolerz' is not a key of evaluate\.py's config; did you mean "
                                        r"'poolers'\?"),
    pytest.param("train.py", ["backbone=bert_larg"], r"^error: train\.py: there is no backbone 'bert_larg'",
                 marks=pytest.mark.slow),
    pytest.param("train.py", ["experiment=quickstart_unsup", "optimizer.lr=nan"],
                 r"^error: optimizer\.lr=nan: Input should be a finite number$", marks=pytest.mark.slow),
    pytest.param("export.py", ["ckpts=a.ckpt"], r"^error: 'ckpts' is not a key of export\.py's config",
                 marks=pytest.mark.slow),
    # read only after the last step: refused before step 0
    ("train.py", ["experiment=quickstart_unsup", "callbacks.sts_evaluation.final_tasks=[]"],
     r"^error: callbacks\.sts_evaluation\.final_tasks=\[\] names no task for the final table: .* or set "
     r"callbacks\.sts_evaluation\.score_best_at_end=false for a run without one$"),
])
def test_entry_points_exit_2_with_one_line_and_leave_nothing(script, argv, pattern, real_data_root, tmp_path):
    out = tmp_path / "out"
    extra = [f"output_dir={out}"] if script != "export.py" else []
    proc = run_entry(script, *argv, *extra, data_root=real_data_root, cwd=tmp_path)
    assert_one_line_error(proc, pattern)
    assert listing(tmp_path) == []


def test_a_key_the_optuna_study_searches_is_refused_on_the_command_line(tiny_bert, real_data_root, tmp_path):
    """Every trial sets its own value of a searched key: `optimizer.lr=1e-3` beside `hparams_search=` would be
    accepted and replaced in each trial; refused in one line before the first trial."""
    out = tmp_path / "study"
    proc = train_py(*fast_overrides(tiny_bert, real_data_root, out), "hparams_search=quickstart_optuna")
    assert_one_line_error(proc, r"^error: optimizer\.lr= is searched by hparams_search "
                                r"\(hparams_search\.params\.optimizer\.lr\): every trial sets its own value; drop it "
                                r"from the command line, or the key from hparams_search\.params$", out)


#: Each command, with a key none of its configs has (Hydra accepts any `+key`): refused by the command's settings
#: (pydantic's extra="forbid", the groups and `_target_` nodes key by key) with the closest valid key, before any
#: work. (script, arguments, the line, exit status: the bench drivers exit 1 on a refusal)
UNKNOWN_KEYS = [
    ("train.py", ["experiment=quickstart_unsup", "+seeed=3"],
     r"^error: seeed is not a key of train\.py's config; did you mean seed\?$", 2),
    ("train.py", ["-m", "experiment=quickstart_unsup", "+data.batch_sizes=4,8"],
     r"^error: data\.batch_sizes is not a parameter of TextLinesDataModule; did you mean data\.batch_size\?$", 2),
    ("evaluate.py", ["+typo=1", "tasks=[STSBenchmark-dev]"], r"^error: typo is not a key of evaluate\.py's config; "
                                                             r"valid: .*\bseed, task_name", 2),
    ("evaluate.py", ["mode=encode", "+seeds=1", "input=IN", "output=emb.npy"],
     r"^error: seeds is not a key of promptemb-encode's config; did you mean seed\?$", 2),
    ("evaluate.py", ["mode=encode", "+family_args.transfer.batch_size=8", "input=IN", "output=emb.npy"],
     r"^error: family_args is not a key of promptemb-encode's config; ", 2),
    ("export.py", ["+typo=1", "ckpt_path=a.ckpt", "output_dir=exported"],
     r"^error: typo is not a key of export\.py's config", 2),
    ("bench/train_throughput.py", ["experiment=quickstart_unsup", "+seeed=3"],
     r"^error: seeed is not a key of train\.py's config; did you mean seed\?$", 1),
    ("bench/step_counts.py", ["experiment=quickstart_unsup", "--random-bert", "1:12", "+extras.print_configs=true"],
     r"^error: extras\.print_configs is not a key of the extras group; did you mean extras\.print_config\?$",
     1),
    ("bench/evaluation_suite.py", ["+pooler_argz.mean.layers=[1]"],
     r"^error: pooler_argz is not a key of evaluate\.py's config; did you mean pooler_args\?$", 1),
]


@pytest.mark.parametrize(("script", "argv", "pattern", "status"), UNKNOWN_KEYS,
                         ids=[f"{script}-{' '.join(argv)}" for script, argv, _, _ in UNKNOWN_KEYS])
def test_every_command_refuses_a_key_its_config_does_not_have(script, argv, pattern, status, real_data_root,
                                                              tmp_path):
    work = tmp_path / "cwd"
    work.mkdir()
    lines = tmp_path / "in.txt"
    lines.write_text("a line\n")
    extra = [f"output_dir={work / 'out'}"] if script in ("train.py", "evaluate.py") and "-m" not in argv else []
    argv = [f"input={lines}" if arg == "input=IN" else arg for arg in argv]
    proc = run_entry(script, *argv, *extra, data_root=real_data_root, cwd=work, timeout=300)
    assert_one_line_error(proc, pattern, status=status)
    assert listing(work) == [] and sorted(p.name for p in tmp_path.iterdir()) == ["cwd", "in.txt"]


def test_the_bench_loop_refuses_a_key_before_training(tmp_path):
    from bench.loop import check_overrides

    with pytest.raises(ConfigError, match=r"^seeed is not a key of train\.py's config; did you mean seed\?$"):
        check_overrides(["experiment=quickstart_unsup", "+seeed=3", f"output_dir={tmp_path / 'run'}"])
    assert listing(tmp_path) == []
