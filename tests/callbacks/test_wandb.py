"""W&B logging on tiny BERTs, offline: run directory with config, per-step metrics and the STS table; resume from
last.ckpt continues the same run id; online mode without credentials is a one-line error (no login prompt)."""

import json
import os
import subprocess
import sys

import pytest
import torch
from pytorch_lightning.loggers import CSVLogger, WandbLogger

from promptemb.callbacks.wandb_run import wandb_run_id
from promptemb.common.errors import ConfigError
from promptemb.evaluation.wandb_tables import log_sts_tables, sts_table_rows
from promptemb.lightning_modules.checkpoint import read_checkpoint
from promptemb.training.csv_logger import ResumableCSVLogger
from promptemb.training.loggers import NO_CREDENTIALS, build_loggers
from promptemb.training.runner import train
from tests.conftest import REPO
from tests.training.test_train import checked, compose_train, tiny_overrides
from tests.wandb_offline import read_run


@pytest.fixture()
def wandb_offline(tmp_path, monkeypatch):
    """W&B offline with every W&B path under tmp_path (no ~/.netrc, ~/.config/wandb or account)."""
    for name, sub in (("WANDB_DIR", "wandb_dir"), ("WANDB_CONFIG_DIR", "wandb_config"),
                      ("WANDB_CACHE_DIR", "wandb_cache"), ("WANDB_DATA_DIR", "wandb_data")):
        (tmp_path / sub).mkdir()
        monkeypatch.setenv(name, str(tmp_path / sub))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    return tmp_path


def test_offline_run_logs_config_metrics_sts_table_and_resume_keeps_run_id(tiny_bert, real_data_root, tmp_path,
                                                                            wandb_offline):
    out = tmp_path / "out"
    base = [*tiny_overrides("quickstart_unsup", tiny_bert, real_data_root, out, None), "logger=wandb",
            "logger.mode=offline", "eval_every_n_steps=2", "trainer.log_every_n_steps=1"]
    first = train(checked(compose_train([*base, "trainer.max_steps=2"])))
    assert first.global_step == 2
    (run_dir,) = (out / "wandb").glob("offline-run-*")
    run_id = run_dir.name.rsplit("-", 1)[1]

    # the STS table of the final 7-task scoring (here STS-B test only), with the same numbers as results.json
    scores = json.loads((out / "results.json").read_text())["scores"]
    (table_file,) = (run_dir / "files/media/table/final").glob("sts_*.table.json")
    table = json.loads(table_file.read_text())
    assert table["columns"] == ["variant", "STSBenchmark", "avg"]
    assert {row[0]: row[1:] for row in table["data"]} == {
        label: [row["STSBenchmark"], row["avg"]] for label, row in scores.items()}
    assert list((run_dir / "files/media/images/final").glob("sts_plot_*.png"))  # results.png

    # hyper-parameters = the full resolved config; per-step metrics at their trainer step
    logged = read_run(run_dir)
    assert logged["config"]["optimizer"]["lr"] == 3.0e-5 and logged["config"]["data"]["batch_size"] == 4
    assert logged["config"]["model"]["model_name_or_path"] == str(tiny_bert)
    steps = {name: sorted(h["trainer/global_step"] for h in logged["history"] if name in h)
             for name in ("train/loss", "val/stsb_dev/mask", "final/sts/path", "final/sts/mask/STSBenchmark")}
    # Lightning logs the loss of batches 0 and 1 at their index; the callback logs each dev score at the optimiser
    # step it was taken after (0 = before training, 2 = after the 2nd step), as curve.json and checkpoint names do
    assert steps["train/loss"] == [0, 1], logged["history"]
    assert steps["val/stsb_dev/mask"] == [0, 2]
    assert steps["final/sts/path"] == steps["final/sts/mask/STSBenchmark"] == [2]
    # what the sweeps optimise: the running maximum of the [MASK] dev score over the evaluations ModelCheckpoint
    # sees (after step 0), logged with it
    evaluations = [h for h in logged["history"] if "val/stsb_dev/mask" in h]
    assert "val/stsb_dev/mask_best" not in evaluations[0] and evaluations[0]["trainer/global_step"] == 0
    dev = [(h["val/stsb_dev/mask"], h["val/stsb_dev/mask_best"]) for h in evaluations[1:]]
    assert dev and [best for _, best in dev] == [max(score for score, _ in dev[:i + 1]) for i in range(len(dev))]

    # the run id travels with the checkpoint; resuming continues the same W&B run
    last = out / "checkpoints" / "last.ckpt"
    assert torch.load(last, weights_only=False)["wandb"]["run_id"] == run_id == wandb_run_id(read_checkpoint(last))
    second = train(checked(compose_train([*base, "trainer.max_steps=4", f"ckpt_path={last}",
                                          "callbacks.sts_evaluation.score_best_at_end=false"])))
    assert second.global_step == 4
    run_dirs = sorted((out / "wandb").glob("offline-run-*"))
    assert len(run_dirs) == 2 and all(d.name.endswith(f"-{run_id}") for d in run_dirs)
    resumed = read_run(run_dirs[1] if run_dirs[0] == run_dir else run_dirs[0])
    assert sorted(h["trainer/global_step"] for h in resumed["history"] if "train/loss" in h) == [2, 3]
    assert torch.load(last, weights_only=False)["wandb"]["run_id"] == run_id


def test_online_without_credentials_is_one_line_error(real_data_root, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "NETRC"))}
    env.update(HOME=str(tmp_path), WANDB_CONFIG_DIR=str(tmp_path / "cfg"), HF_HUB_OFFLINE="1",
               PROMPTEMB_DATA=str(real_data_root))
    proc = subprocess.run([sys.executable, "train.py", "experiment=quickstart_unsup", "logger=wandb",
                           f"output_dir={tmp_path / 'out'}"], cwd=REPO, env=env, capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip() == f"error: {NO_CREDENTIALS}"
    assert not (tmp_path / "out" / "wandb").exists()  # failed before any run was created


def test_logger_groups_and_modes(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "disabled")
    cfg = compose_train(["logger=many_loggers", f"output_dir={tmp_path}"])
    loggers = build_loggers(cfg.logger)
    assert [type(lg) for lg in loggers] == [ResumableCSVLogger, WandbLogger]
    assert loggers[1]._wandb_init["mode"] == "disabled" and loggers[1]._wandb_init["dir"] == str(tmp_path)
    assert compose_train([]).logger._target_.endswith("CSVLogger")  # the no-account default
    with pytest.raises(ConfigError, match=r"logger.mode='offlne' is not a W&B mode; use one of online, offline"):
        build_loggers(compose_train(["logger=wandb", "logger.mode=offlne"]).logger)
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)  # credentials present: online is accepted (nothing starts yet)
    (online,) = build_loggers(compose_train(["logger=wandb", "logger.mode=online"]).logger)
    assert online._wandb_init["mode"] == "online" and online._experiment is None


def test_sts_table_rows_and_no_wandb_logger_is_a_no_op():
    result = {"scores": {"mask": {"STS12": 50.0, "STSBenchmark": 60.0, "avg": 55.0},
                         "avg": {"STS12": 40.0, "STSBenchmark": 45.0, "avg": 42.5}}}
    columns, rows = sts_table_rows(result)
    assert columns == ["variant", "STS12", "STSBenchmark", "avg"]
    assert rows == [["mask", 50.0, 60.0, 55.0], ["avg", 40.0, 45.0, 42.5]]
    assert log_sts_tables([CSVLogger("unused")], result) == 0
