"""train.py configs end to end on a tiny BERT: every experiment with fast_dev_run, resume, NaN stop, bad input."""

import csv
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from hydra import compose, initialize_config_dir

from promptemb.common.errors import ConfigError, DataError
from promptemb.common.hydra_bridge import plain
from promptemb.common.validation import COMPOSITION
from promptemb.data.datamodules import TextLinesDataModule
from promptemb.data.training_corpora import read_nli_csv, read_text_lines, sick_triplets
from promptemb.lightning_modules.base import NonFiniteLossError
from promptemb.lightning_modules.promptbert import PromptBERTSup, PromptBERTUnsup
from promptemb.training.command_line import check_train_command, experiment_names
from promptemb.training.runner import best_dev_score, train
from promptemb.training.settings import TrainSettings
from tests.conftest import REPO

WIKI_SAMPLE = "training/partial/wiki1m_for_simcse.first11914lines.txt"


def compose_train(overrides):
    with initialize_config_dir(str(REPO / "configs"), version_base="1.3"):
        return compose("train", overrides=overrides)


def checked(cfg) -> TrainSettings:
    """What train.py's task does with a composed config before it trains: the one check, into `TrainSettings`."""
    return TrainSettings.model_validate(plain(cfg))


@pytest.fixture()
def nli_csv(tmp_path) -> Path:
    path = tmp_path / "nli.csv"
    rows = [("a man plays a guitar", "a person plays music", "nobody plays anything"),
            ("a dog runs outside", "an animal is moving", "the dog sleeps"),
            ("two kids are eating", "children eat food", "the kids are starving"),
            ("a woman slices onions", "someone cuts vegetables", "a woman is sleeping")] * 2
    path.write_text("sent0,sent1,hard_neg\n" + "".join(",".join(r) + "\n" for r in rows))
    return path


def tiny_overrides(name, tiny_bert, root, out, nli_csv):
    cfg = compose_train([f"experiment={name}"])
    overrides = [f"experiment={name}", f"backbone.name_or_path={tiny_bert}", f"data_root={root}",
                 f"output_dir={out}", "trainer.accelerator=cpu", "trainer.precision=32-true",
                 "callbacks.sts_evaluation.final_tasks=[STSBenchmark]", "data.batch_size=4", "data.num_workers=0"]
    if cfg.data._target_.endswith("TextLinesDataModule"):
        overrides += ["data.download=null", f"data.files=[{WIKI_SAMPLE}]", "data.max_examples=64"]
    elif cfg.data.format == "nli_csv":
        overrides += ["data.download=null", f"data.file={nli_csv}"]
    return overrides


def test_experiment_list():
    assert experiment_names() == ["angle_nli", "angle_stsb", "cotbert_unsup", "cotbert_unsup_roberta",
                                  "dcpcse_sup", "dcpcse_unsup", "llm2vec_mntp", "llm2vec_simcse", "llm2vec_sup",
                                  "optiprompt", "optiprompt_roberta", "pcc_tuning",
                                  "promptbert_sup", "promptbert_sup_roberta", "promptbert_unsup",
                                  "promptbert_unsup_roberta", "prompteol_sup", "quickstart_angle",
                                  "quickstart_angle_triplets", "quickstart_cotbert", "quickstart_dcpcse_sup",
                                  "quickstart_dcpcse_unsup", "quickstart_llm2vec_mntp",
                                  "quickstart_llm2vec_mntp_smollm2", "quickstart_llm2vec_simcse",
                                  "quickstart_llm2vec_simcse_smollm2", "quickstart_llm2vec_sup",
                                  "quickstart_llm2vec_sup_smollm2", "quickstart_optiprompt",
                                  "quickstart_pcc_tuning_smollm2", "quickstart_prompteol_sup",
                                  "quickstart_prompteol_sup_smollm2", "quickstart_sup",
                                  "quickstart_sup_mpnet", "quickstart_unsup", "quickstart_unsup_mpnet"]


#: Recipes that fine-tune a decoder (a causal LM) do not run on the tiny BERT:
#: tests/lightning_modules/test_prompteol_sup.py, test_llm2vec.py and test_pcc_tuning.py run them on a tiny LLaMA.
DECODER_EXPERIMENTS = ("prompteol_sup", "quickstart_prompteol_sup", "quickstart_prompteol_sup_smollm2",
                       "pcc_tuning", "quickstart_pcc_tuning_smollm2",
                       "llm2vec_mntp", "quickstart_llm2vec_mntp", "llm2vec_simcse", "quickstart_llm2vec_simcse",
                       "llm2vec_sup", "quickstart_llm2vec_sup", "quickstart_llm2vec_mntp_smollm2",
                       "quickstart_llm2vec_simcse_smollm2", "quickstart_llm2vec_sup_smollm2")


@pytest.mark.parametrize("name", [name for name in experiment_names() if name not in DECODER_EXPERIMENTS])
def test_every_experiment_runs_fast_dev_run(name, tiny_bert, tiny_mpnet, real_data_root, tmp_path, nli_csv):
    out = tmp_path / "out"
    backbone = tiny_mpnet if "mpnet" in name else tiny_bert
    cfg = compose_train([*tiny_overrides(name, backbone, real_data_root, out, nli_csv), "debug=fdr"])
    assert cfg.trainer.fast_dev_run is True and cfg.trainer.detect_anomaly is True
    trainer = train(checked(cfg))
    assert trainer.state.finished and trainer.global_step == 1
    results = json.loads((out / "results.json").read_text())
    if "dcpcse" in name:  # deep prompts on the plain sentence: the official [CLS], no template
        assert set(results["scores"]) == {"cls", "avg"}
        assert -100 <= results["scores"]["cls"]["STSBenchmark"] <= 100
    else:
        assert set(results["scores"]) == {"mask", "avg"}
        assert -100 <= results["scores"]["mask"]["STSBenchmark"] <= 100
        assert results["provenance"]["input"]["template"].count("[MASK]") >= 1
    assert results["provenance"]["config"]["model"]["_target_"] == cfg.model._target_


def test_published_recipes_keep_their_hyperparameters():
    unsup, sup, opti = (compose_train([f"experiment={n}"]) for n in ("promptbert_unsup", "promptbert_sup",
                                                                     "optiprompt"))
    assert (unsup.optimizer.lr, unsup.data.batch_size, unsup.trainer.max_epochs, unsup.eval_every_n_steps) == (
        1e-5, 256, 1, 125)
    assert unsup.model.model_name_or_path == "bert-base-uncased" and unsup.model.temperature == 0.05
    assert (sup.optimizer.lr, sup.data.batch_size, sup.trainer.max_epochs) == (5e-5, 512, 3)
    assert (opti.optimizer.lr, opti.data.batch_size, opti.trainer.max_epochs) == (3e-5, 256, 5)
    unsup_r, sup_r, opti_r = (compose_train([f"experiment={n}_roberta"]) for n in ("promptbert_unsup",
                                                                                 "promptbert_sup", "optiprompt"))
    assert (unsup_r.optimizer.lr, unsup_r.data.batch_size, unsup_r.trainer.max_epochs) == (1e-5, 256, 1)
    assert (sup_r.optimizer.lr, sup_r.data.batch_size, sup_r.trainer.max_epochs) == (5e-5, 512, 3)
    assert (opti_r.optimizer.lr, opti_r.data.batch_size, opti_r.trainer.max_epochs) == (3e-5, 256, 5)
    # the official recipes train with Hugging Face Trainer, whose default clips the gradient norm at 1.0
    paper = (unsup, sup, opti, unsup_r, sup_r, opti_r)
    assert [cfg.trainer.gradient_clip_val for cfg in paper] == [1.0] * 6
    assert {cfg.trainer.get("gradient_clip_algorithm", "norm") for cfg in paper} == {"norm"}


def test_resume_continues_from_the_saved_step(tiny_bert, real_data_root, tmp_path, nli_csv):
    out = tmp_path / "out"
    base = [*tiny_overrides("quickstart_unsup", tiny_bert, real_data_root, out, nli_csv), "eval_every_n_steps=2",
            "callbacks.sts_evaluation.score_best_at_end=false", "trainer.log_every_n_steps=1"]
    first = train(checked(compose_train([*base, "trainer.max_steps=4"])))
    assert first.global_step == 4
    last = out / "checkpoints" / "last.ckpt"
    assert torch.load(last, weights_only=False)["global_step"] == 4
    second = train(checked(compose_train([*base, "trainer.max_steps=6", f"ckpt_path={last}"])))
    assert second.global_step == 6
    history = next(c for c in second.callbacks if type(c).__name__ == "STSEvaluationCallback").history
    assert [point["step"] for point in history] == [0, 2, 4, 6]  # the saved curve goes on; step 0 not re-scored
    assert [point["step"] for point in json.loads((out / "curve.json").read_text())["points"]] == [0, 2, 4, 6]
    # metrics.csv keeps the first run's rows (Lightning's CSVLogger would delete them): each training step's loss
    # once, each dev evaluation once
    rows = list(csv.DictReader((out / "csv" / "metrics.csv").open()))
    assert [int(r["step"]) for r in rows if r.get("train/loss")] == [0, 1, 2, 3, 4, 5]
    assert [int(r["step"]) for r in rows if r.get("val/stsb_dev/mask")] == [0, 2, 4, 6]


@pytest.mark.parametrize("content, message", [
    (b"not a checkpoint", r"checkpoint .*broken.ckpt is corrupt or not a PyTorch checkpoint"),
    (None, r"checkpoint .*broken.ckpt does not exist; pass ckpt_path=PATH"),
])
def test_resume_from_missing_or_corrupt_checkpoint_is_one_line_error(content, message, tiny_bert, real_data_root,
                                                                     tmp_path, nli_csv):
    ckpt = tmp_path / "broken.ckpt"
    if content is not None:
        ckpt.write_bytes(content)
    cfg = compose_train([*tiny_overrides("quickstart_unsup", tiny_bert, real_data_root, tmp_path / "o", nli_csv),
                         f"ckpt_path={ckpt}"])
    with pytest.raises((ConfigError, DataError), match=message):
        train(checked(cfg))
    assert not (tmp_path / "o").exists()


def test_nan_loss_stops_with_clear_error_and_keeps_last_good_checkpoint(tiny_bert, real_data_root, tmp_path,
                                                                         nli_csv, monkeypatch):
    import promptemb.lightning_modules.base as base_module

    real, calls = base_module.info_nce, {"n": 0}

    def poisoned(*args, **kwargs):
        calls["n"] += 1
        loss = real(*args, **kwargs)
        return loss * float("nan") if calls["n"] == 3 else loss

    monkeypatch.setattr(base_module, "info_nce", poisoned)
    out = tmp_path / "out"
    cfg = compose_train([*tiny_overrides("quickstart_unsup", tiny_bert, real_data_root, out, nli_csv),
                         "eval_every_n_steps=2", "trainer.max_steps=5"])
    with pytest.raises(NonFiniteLossError, match="loss is nan at step 2; stopped before the optimiser step"):
        train(checked(cfg))
    saved = torch.load(out / "checkpoints" / "last.ckpt", weights_only=False)
    assert saved["global_step"] == 2
    assert all(torch.isfinite(t).all() for t in saved["state_dict"].values() if t.is_floating_point())


def run_train(*overrides):
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "train.py", *overrides], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)


@pytest.mark.parametrize("debug, steps", [("limit", 6), pytest.param("overfit", 40, marks=pytest.mark.slow),
                                          pytest.param("profiler", 16, marks=pytest.mark.slow)])
def test_the_other_debug_configs_train(debug, steps, tiny_bert, real_data_root, tmp_path, nli_csv):
    """debug=limit (3 epochs of 2 batches here: the tiny corpus has too few batches for 1%), overfit (the same 2
    batches for 20 epochs) and profiler (one epoch, at most 20 steps: the 16 batches of 64 examples) run end to end."""
    sizes = {"limit": ["trainer.limit_train_batches=2"], "overfit": ["trainer.overfit_batches=2"], "profiler": []}
    cfg = compose_train([*tiny_overrides("quickstart_unsup", tiny_bert, real_data_root, tmp_path / "o", nli_csv),
                         f"debug={debug}", "callbacks.sts_evaluation.score_best_at_end=false",
                         "eval_every_n_steps=1000", *sizes[debug]])
    assert train(checked(cfg)).global_step == steps


@pytest.mark.parametrize("recipe", ["quickstart_unsup", pytest.param("quickstart_sup", marks=pytest.mark.slow),
                                    pytest.param("quickstart_optiprompt", marks=pytest.mark.slow)])
def test_debug_fdr_from_the_command_line(recipe, tiny_bert, real_data_root, tmp_path):
    """`python train.py experiment=... debug=fdr`: one batch, then the final scoring; Hydra's files and the printed
    config inside the run folder."""
    out = tmp_path / "run"
    data = ([f"data.files=[{WIKI_SAMPLE}]", "data.max_examples=64"] if recipe != "quickstart_sup"
            else ["data.max_examples=16"])
    proc = run_train(f"experiment={recipe}", "debug=fdr", f"backbone.name_or_path={tiny_bert}",
                     f"data_root={real_data_root}", f"output_dir={out}", "data.batch_size=4", *data)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert set(json.loads((out / "results.json").read_text())["scores"]) == {"mask", "avg"}
    assert (out / ".hydra" / "config.yaml").is_file() and "config:" in (out / "train.log").read_text()


@pytest.mark.slow
def test_hydra_multirun_runs_each_job_with_its_values(tiny_bert, real_data_root, tmp_path, nli_csv):
    """The README's offline sweep: `train.py -m` with a comma sweep, one output_dir per job."""
    base = [o for o in tiny_overrides("quickstart_unsup", tiny_bert, real_data_root, tmp_path, nli_csv)
            if not o.startswith("output_dir=")]
    proc = run_train("-m", *base, "trainer.max_steps=2", "eval_every_n_steps=2", "optimizer.lr=1e-5,2e-5",
                     f"output_dir={tmp_path}/job${{hydra:job.num}}", f"hydra.sweep.dir={tmp_path}/sweep")
    assert proc.returncode == 0, proc.stderr[-2000:]
    for job, lr in enumerate([1e-5, 2e-5]):
        results = json.loads((tmp_path / f"job{job}" / "results.json").read_text())
        assert results["provenance"]["config"]["optimizer"]["lr"] == lr
        assert set(results["scores"]) >= {"mask", "avg"}
    assert (tmp_path / "sweep" / "multirun.yaml").is_file()


def test_objective_falls_back_to_the_logged_dev_scores(tiny_bert, real_data_root, tmp_path, nli_csv):
    """train.py's return value (the Optuna objective) is never None once a dev score exists: a run too short for a
    monitored checkpoint returns the best score the callback logged (step 0 here)."""
    cfg = compose_train([*tiny_overrides("quickstart_unsup", tiny_bert, real_data_root, tmp_path / "o", nli_csv),
                         "trainer.max_steps=1", "eval_every_n_steps=2",
                         "callbacks.sts_evaluation.score_best_at_end=false"])
    trainer = train(checked(cfg))
    assert trainer.checkpoint_callback.best_model_score is None
    history = next(c for c in trainer.callbacks if type(c).__name__ == "STSEvaluationCallback").history
    assert [point["step"] for point in history] == [0]
    assert best_dev_score(trainer) == history[0]["mask"]


def test_multirun_unknown_key_is_one_line_naming_it():
    proc = run_train("-m", "experiment=quickstart_unsup", "model.learning_rate=1e-5,2e-5", "trainer=default,gpu")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "error: 'model.learning_rate' is not a key of train.py's config; did you mean 'optimizer.lr'? "
        "prefix it with '+' (+model.learning_rate=...) only if it is really a new key"]


def test_multirun_sweeps_check_every_option_of_every_group():
    """Hydra composes a sweep's jobs one by one: a missing option would end the sweep at its job, so every value of
    a group's sweep is checked before the first job (experiments and any other group)."""
    check_train_command(["-m", "experiment=quickstart_unsup,optiprompt", "optimizer.lr=1e-5,2e-5"])
    check_train_command(["-m", "experiment=choice(quickstart_unsup,quickstart_sup)"])
    count = len(experiment_names())
    with pytest.raises(ConfigError, match=rf"^train.py: there is no experiment 'nope' "
                                          rf"\(configs/experiment/nope.yaml\); all {count} are listed in "
                                          rf"configs/experiment/$"):
        check_train_command(["-m", "experiment=quickstart_unsup,nope"])
    with pytest.raises(ConfigError, match=r"there is no template 'promptbert_bret'.*did you mean "
                                          r"promptbert_bert"):
        check_train_command(["-m", "experiment=quickstart_unsup", "template=promptbert_bert,promptbert_bret"])


def test_unknown_experiment_names_the_closest_and_where_all_are_listed():
    """The valid experiments are many: the one line names the closest few and where the rest are listed, not all of
    them."""
    assert "quickstart_angle" in experiment_names() and "quickstart_unsup" in experiment_names()
    proc = run_train("experiment=quickstart_unsop")
    assert proc.returncode == 2
    assert proc.stderr.strip() == (f"error: train.py: there is no experiment 'quickstart_unsop' "
                                   f"(configs/experiment/quickstart_unsop.yaml); did you mean quickstart_unsup or "
                                   f"quickstart_sup or quickstart_unsup_mpnet? all {len(experiment_names())} are "
                                   "listed in configs/experiment/")


def test_template_without_mask_is_a_config_error(tiny_bert):
    with pytest.raises(ConfigError, match=r"PromptBERTUnsup needs a \[MASK\] in the template"):
        PromptBERTUnsup(str(tiny_bert), templates=['This sentence : "[X]" .', 'This "[X]" means [MASK] .'])


def test_global_batch_must_divide_by_world_size():
    class FakeTrainer:
        world_size = 4

    module = TextLinesDataModule(files=["x"], batch_size=6)
    module.trainer = FakeTrainer()
    with pytest.raises(ConfigError, match="global batch size 6 is not divisible by the world size 4"):
        _ = module.per_device_batch_size
    FakeTrainer.world_size = 2
    assert module.per_device_batch_size == 3


def test_nli_file_with_missing_columns(tmp_path):
    path = tmp_path / "nli.csv"
    path.write_text("sent0,sent1\na,b\n")
    expected = r"nli\.csv: missing column\(s\) hard_neg; expected a header sent0,sent1,hard_neg"
    with pytest.raises(DataError, match=expected):
        read_nli_csv(path)


def test_invalid_utf8_in_a_training_corpus_names_file_and_line(tmp_path):
    """Never silently replaced by U+FFFD: the corpus would train on text that is not in the file."""
    lines = tmp_path / "corpus.txt"
    lines.write_bytes(b"first line\r\nsecond\n\xff bad\n")
    with pytest.raises(DataError, match=r"corpus\.txt:3: not valid UTF-8 \(invalid start byte: byte 0xff at byte 1"):
        read_text_lines([lines])
    lines.write_bytes(b"first line\r\nsecond\rthird\n\n")
    assert read_text_lines([lines]) == ["first line", "second", "third"]
    nli = tmp_path / "nli.csv"
    nli.write_bytes(b"sent0,sent1,hard_neg\na,b,c\nd,\xc3(,f\n")
    with pytest.raises(DataError, match=r"nli\.csv:3: not valid UTF-8"):
        read_nli_csv(nli)


def test_empty_corpus(tmp_path):
    path = tmp_path / "empty.txt"
    path.write_text("\n  \n")
    with pytest.raises(DataError, match="empty corpus: no non-blank line in"):
        read_text_lines([path])


def test_sick_triplets_are_entailment_pairs_with_contradiction_partners(real_data_root):
    triplets = sick_triplets(real_data_root / "downstream/SICK/SICK_train.txt")
    rows = [line.rstrip("\n").split("\t") for line in
            (real_data_root / "downstream/SICK/SICK_train.txt").read_text().splitlines()[1:]]
    entail = {(r[1], r[2]) for r in rows if r[4] == "ENTAILMENT"}
    contra = {frozenset((r[1], r[2])) for r in rows if r[4] == "CONTRADICTION"}
    assert len(triplets) == 494
    for premise, positive, negative in triplets:
        assert (premise, positive) in entail
        assert frozenset((premise, negative)) in contra or frozenset((positive, negative)) in contra


def test_supervised_head_initialised_from_checkpoint_mlm_head(tiny_bert):
    from transformers import BertForMaskedLM

    module = PromptBERTSup(str(tiny_bert))
    reference = BertForMaskedLM.from_pretrained(tiny_bert).cls.predictions.transform
    assert module.head_initialised_from_checkpoint
    torch.testing.assert_close(module.head.dense.weight, reference.dense.weight)
    torch.testing.assert_close(module.head.layer_norm.weight, reference.LayerNorm.weight)


def test_callback_scores_configured_poolers_and_post_processors(tiny_bert, real_data_root, tmp_path, nli_csv):
    """The final table holds the module's mask/avg plus every configured pooler raw and post-processed, all from
    the same encoder; dev evaluations log the dev_poolers too; ditto works although training runs in SDPA."""
    out = tmp_path / "out"
    cfg = compose_train([*tiny_overrides("quickstart_unsup", tiny_bert, real_data_root, out, nli_csv),
                         "trainer.max_steps=2", "eval_every_n_steps=2",
                         "callbacks.sts_evaluation.poolers=[mean,ditto,idf,mask]",
                         "+callbacks.sts_evaluation.pooler_args.ditto.layer=1",
                         "+callbacks.sts_evaluation.pooler_args.ditto.head=1",
                         "callbacks.sts_evaluation.post=[zscore]", "callbacks.sts_evaluation.dev_poolers=[mean]",
                         "callbacks.sts_evaluation.analysis=true"])
    trainer = train(checked(cfg))
    results = json.loads((out / "results.json").read_text())
    raw = ["mask", "avg", "mean", "ditto", "idf(T)"]
    assert list(results["scores"]) == [name for r in raw for name in (r, f"{r}+zscore(T)")]
    assert results["provenance"]["poolers"]["ditto"]["attention_head"] == 1
    assert results["provenance"]["post_processing"]["mean+zscore(T)"]["fit_corpus"] == "T"
    assert set(results["analysis"]["mean"]["STSBenchmark"]) >= {"anisotropy", "uniformity"}
    assert results["provenance"]["tasks"]["STSBenchmark"]["files"]
    module = trainer.lightning_module
    assert module.transformer.config._attn_implementation != "eager"  # switched back after scoring ditto
    history = next(c for c in trainer.callbacks if type(c).__name__ == "STSEvaluationCallback").history
    assert [set(point) - {"step", "seconds"} for point in history] == [{"mask", "avg", "mean"}] * 2
    logged = (out / "csv" / "metrics.csv").read_text().splitlines()[0].split(",")
    assert {"val/stsb_dev/mask", "val/stsb_dev/avg", "val/stsb_dev/mean"} <= set(logged)


def test_callback_rejects_unknown_pooler_before_training(tiny_bert, real_data_root, tmp_path, nli_csv):
    cfg = compose_train([*tiny_overrides("quickstart_unsup", tiny_bert, real_data_root, tmp_path / "o", nli_csv),
                         "callbacks.sts_evaluation.poolers=[mean,maxx]"])
    with pytest.raises(ConfigError, match="maxx"):
        train(checked(cfg))
    assert not (tmp_path / "o" / "checkpoints").exists()


@pytest.mark.parametrize("overrides, error, message", [
    (["callbacks.sts_evaluation.poolers=[ditto]", "+callbacks.sts_evaluation.pooler_args.ditto.head=99"],
     ConfigError, r"ditto layer 0 / head 99 is out of range"),
    (["callbacks.sts_evaluation.post=[zscore]", "callbacks.sts_evaluation.fit_corpus=file:no/such.txt"],
     DataError, r"fit corpus 'file:no/such.txt': file .*no/such.txt does not exist"),
    (["callbacks.sts_evaluation.poolers=[idf]", "+callbacks.sts_evaluation.pooler_args.idf.corpus=file:gone.txt"],
     DataError, r"fit corpus 'file:gone.txt': file .* does not exist"),
    (["callbacks.sts_evaluation.dev_poolers=[ditto]", "+callbacks.sts_evaluation.pooler_args.ditto.head=99",
      "callbacks.sts_evaluation.score_best_at_end=false", "callbacks.sts_evaluation.evaluate_before_training=false"],
     ConfigError, r"ditto layer 0 / head 99 is out of range"),  # dev poolers too, even with no final scoring
    (["callbacks.sts_evaluation.poolers=[mask]", "+callbacks.sts_evaluation.pooler_args.mask.layer=-2"],
     ConfigError, r"^callbacks\.sts_evaluation\.pooler_args\.mask would be ignored: mask is the model's own pooler"),
])
def test_callback_checks_fit_end_poolers_and_corpora_before_training(overrides, error, message, tiny_bert,
                                                                    real_data_root, tmp_path, nli_csv):
    """What only the model or the data can refute (head range, corpus files) is checked at fit start, not after
    a whole training run: no dev evaluation, no step, no checkpoint."""
    out = tmp_path / "o"
    cfg = compose_train([*tiny_overrides("quickstart_unsup", tiny_bert, real_data_root, out, nli_csv), *overrides])
    with pytest.raises(error, match=message):
        train(checked(cfg))
    assert not (out / "curve.json").exists()
    assert not list(out.rglob("*.ckpt"))


def test_relative_corpus_path_is_relative_to_the_data_root_not_the_cwd(tmp_path, monkeypatch):
    """A same-named file in the current directory must not silently replace the configured corpus."""
    root, elsewhere = tmp_path / "root", tmp_path / "cwd"
    for directory, text in ((root, "from the data root\n"), (elsewhere, "from the current directory\n")):
        (directory / "training").mkdir(parents=True)
        (directory / "training" / "corpus.txt").write_text(text)
    monkeypatch.chdir(elsewhere)
    module = TextLinesDataModule(files=["training/corpus.txt"], batch_size=1, data_root=str(root), held_out_tasks=[])
    assert list(module.iter_examples()) == ["from the data root"]
    absolute = TextLinesDataModule(files=[str(elsewhere / "training/corpus.txt")], batch_size=1, data_root=str(root))
    assert list(absolute.iter_examples()) == ["from the current directory"]


ON_CPU = SimpleNamespace(root_device=torch.device("cpu"))  # a fake trainer's strategy: trains on the CPU


def test_fit_end_scores_the_best_checkpoint_safely_and_restores_the_live_weights(tiny_bert, real_data_root,
                                                                                  tmp_path, monkeypatch):
    """The best checkpoint is read with torch.load(weights_only=True), scored, and the module the caller holds
    keeps the weights it was trained to."""

    from promptemb.callbacks.sts_evaluation import STSEvaluationCallback

    module = PromptBERTUnsup(str(tiny_bert))
    live = {name: tensor.clone() for name, tensor in module.state_dict().items()}
    best = {name: tensor + 0.01 if tensor.is_floating_point() else tensor for name, tensor in live.items()}
    path = tmp_path / "best.ckpt"
    torch.save({"state_dict": best}, path)
    callback = STSEvaluationCallback.from_config(output_dir=str(tmp_path / "out"), data_root=str(real_data_root),
                                     final_tasks=["STSBenchmark"], provenance={"seed": 1})
    scored, real_score = {}, callback.score

    def spy(scored_module, *args, **kwargs):
        scored.update({name: tensor.clone() for name, tensor in scored_module.state_dict().items()})
        return real_score(scored_module, *args, **kwargs)

    loads, real_load = [], torch.load

    def recording_load(*args, **kwargs):
        loads.append(kwargs.get("weights_only"))
        return real_load(*args, **kwargs)

    monkeypatch.setattr(callback, "score", spy)
    monkeypatch.setattr(torch, "load", recording_load)
    trainer = SimpleNamespace(checkpoint_callback=SimpleNamespace(best_model_path=str(path),
                                                                  best_model_score=torch.tensor(50.0)),
                              interrupted=False, is_global_zero=True, loggers=[], strategy=ON_CPU, global_step=2)
    callback.on_fit_end(trainer, module)
    assert loads and all(flag is True for flag in loads)
    for name, tensor in module.state_dict().items():
        torch.testing.assert_close(scored[name], best[name])
        torch.testing.assert_close(tensor, live[name])
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert results["provenance"]["model"]["checkpoint"] == str(path)


def test_fit_end_scores_transfer_and_clustering_groups_and_logs_them_like_sts(tiny_bert, mini_data, tmp_path,
                                                                              monkeypatch):
    """final_tasks may name transfer and clustering tasks (here mock tasks in a mock registry): the fit-end scoring
    runs them through their own protocols, writes one table and PNG per family and logs each family's scores under
    final/<family>/<pooler>/<task>, as the STS ones are logged under final/sts/..."""

    import promptemb.callbacks.sts_evaluation as sts_evaluation
    from promptemb.evaluation.wandb_tables import sts_table_rows
    from tests.evaluation.test_transfer import write_mini_labeled

    root, registry = mini_data
    write_mini_labeled(root, registry)
    callback = sts_evaluation.STSEvaluationCallback.from_config(
        output_dir=str(tmp_path / "out"), data_root=str(root), final_tasks=["MINI-B", "MINITR", "MINICL"],
        task_registry=str(registry), poolers=["mean"], provenance={"seed": 1},
        family_args={"transfer": {"kfold": 2, "max_epoch": 4, "l2_grid": [0.001, 0.01]},
                     "clustering": {"trials": 2, "n_init": 2}})
    logged = {}

    def record(loggers, result, key="final/sts", step=None, image_path=None):
        columns, rows = sts_table_rows(result)  # what log_sts_tables sends to W&B
        logged[key] = {"scores": result["scores"], "step": step, "image": image_path,
                       "scalars": {f"{key}/{row[0]}/{task}" for row in rows for task in columns[1:]}}
        return 0

    monkeypatch.setattr(sts_evaluation, "log_sts_tables", record)
    module = PromptBERTUnsup(str(tiny_bert))
    trainer = SimpleNamespace(checkpoint_callback=SimpleNamespace(best_model_path="", best_model_score=None),
                              interrupted=False, is_global_zero=True, loggers=[], strategy=ON_CPU, global_step=3)
    callback.on_fit_end(trainer, module)
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert list(results["families"]) == ["sts", "transfer", "clustering"]
    assert set(logged) == {"final/sts", "final/transfer", "final/clustering"}
    for family, task in (("sts", "MINI-B"), ("transfer", "MINITR"), ("clustering", "MINICL")):
        scores = results["families"][family]["scores"]
        assert set(scores) == {"mask", "avg", "mean"}  # the module's poolers plus the configured one
        assert all(task in row and "avg" in row for row in scores.values())
        entry = logged[f"final/{family}"]
        assert entry["scores"] == scores and entry["step"] == 3
        assert entry["image"] == tmp_path / "out" / sts_evaluation.plot_name(family) and entry["image"].is_file()
        assert f"final/{family}/mean/{task}" in entry["scalars"] and f"final/{family}/mask/avg" in entry["scalars"]
    assert results["families"]["transfer"]["protocol"]["kfold"] == 2
    assert results["families"]["clustering"]["protocol"]["trials"] == 2
    assert len(results["families"]["clustering"]["details"]["mean"]["MINICL"]["trials"]) == 2


@pytest.mark.parametrize(("overrides", "pattern"), [
    (["callbacks.sts_evaluation.final_tasks=[]"], r"^callbacks\.sts_evaluation\.final_tasks=\[\] names no task"),
    (["callbacks.sts_evaluation.final_tasks=[STS12,STS99]"],
     r"^callbacks\.sts_evaluation\.final_tasks=\['STS12', 'STS99'\]: unknown task STS99; valid tasks: STS12"),
    (["callbacks.sts_evaluation.dev_task=STS-dev"], r"^callbacks\.sts_evaluation\.dev_task=STS-dev: unknown task"),
    (["callbacks.sts_evaluation.dev_task=sts"], r"^callbacks\.sts_evaluation\.dev_task=sts is not one STS task"),
    (["callbacks.sts_evaluation.dev_task=MR"], r"^callbacks\.sts_evaluation\.dev_task=MR is not one STS task"),
    (["+callbacks.sts_evaluation.family_args.transfer.kfold=3"],
     r"^callbacks\.sts_evaluation\.family_args\.transfer is read by no task of callbacks\.sts_evaluation\."
     r"final_tasks=\[STS12,STS13,STS14,STS15,STS16,STSBenchmark,SICKRelatedness\] \(none is a transfer task\)"),
])
def test_the_callbacks_tasks_are_checked_before_step_0(overrides, pattern):
    """The dev task (read at step 0) and the final tasks (read after the last step) exist; an empty final list is
    refused with the switch that turns the final table off, which makes it unread."""
    with pytest.raises(ConfigError, match=pattern):
        TrainSettings.model_validate(plain(compose_train(["experiment=quickstart_unsup", *overrides])),
                                     context=COMPOSITION)
    TrainSettings.model_validate(plain(compose_train([
        "experiment=quickstart_unsup", "callbacks.sts_evaluation.final_tasks=[]",
        "callbacks.sts_evaluation.score_best_at_end=false"])), context=COMPOSITION)
    TrainSettings.model_validate(plain(compose_train([
        "experiment=quickstart_unsup", "callbacks.sts_evaluation.final_tasks=[sts,MR]"])), context=COMPOSITION)


def test_checkpoint_selection_must_read_the_dev_score_the_callback_logs():
    """Another dev_task logs under another name: selecting on the default name would keep no best checkpoint (Lightning
    only warns), so the config is refused; the monitor and filename of that name pass."""
    subset = ["experiment=quickstart_unsup", "callbacks.sts_evaluation.dev_task=STSBenchmark-dev-every5"]
    with pytest.raises(ConfigError, match=r"^callbacks.model_checkpoint reads val/stsb_dev/mask, which is never "
                                          r"logged: with dev_task=STSBenchmark-dev-every5 the STS callback logs "
                                          r"val/stsb_dev-every5/<pooler>; set its monitor \(and filename\) to "
                                          r"val/stsb_dev-every5/mask$"):
        checked(compose_train(subset))
    with pytest.raises(ConfigError, match=r"reads val/stsb_dev/mask, which is never logged"):  # the file name alone
        checked(compose_train([*subset, "callbacks.model_checkpoint.monitor=val/stsb_dev-every5/mask"]))
    TrainSettings.model_validate(plain(compose_train([
        *subset, "callbacks.model_checkpoint.monitor=val/stsb_dev-every5/mask",
        "callbacks.model_checkpoint.filename='step{step}-mask{val/stsb_dev-every5/mask:.2f}'"])), context=COMPOSITION)
