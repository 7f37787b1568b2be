"""Scores the model being trained with the evaluation spine (same Encoder, poolers and scorer as evaluate.py).

* every `every_n_steps` optimiser steps (and once before training): STS-B dev with the module's evaluation poolers
  ([MASK] and avg at least), logged as `val/stsb_dev/<pooler>` so ModelCheckpoint can select on it;
* at the end of fit: the best checkpoint (by the monitored metric) on the 7 STS tasks, written as results.json,
  results.md and results.png, plus the dev curve (curve.json / curve.png).
Every rank computes the (identical) dev scores, so no collective is needed; only rank 0 writes files.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytorch_lightning as pl
import torch

from common.io import atomic_write_json
from data.root import resolve_data_root
from data.tasks import STS_SUITE, get_tasks
from encoder.model import Encoder
from evaluation.plots import plot_curve
from evaluation.report import scoring_provenance, write_report
from evaluation.sts import evaluate_sts
from evaluation.wandb_tables import log_sts_tables
from poolers.base import Pooler

log = logging.getLogger(__name__)


class STSEvaluationCallback(pl.Callback):
    def __init__(
        self,
        output_dir: str,
        data_root: str | None = None,
        every_n_steps: int = 125,
        dev_task: str = "STSBenchmark-dev",
        final_tasks: list[str] | tuple[str, ...] = STS_SUITE,
        batch_size: int = 128,
        evaluate_before_training: bool = True,
        score_best_at_end: bool = True,
        provenance: dict | None = None,
    ):
        self.output_dir = Path(output_dir)
        self.data_root = data_root
        self.every_n_steps = every_n_steps
        self.dev_task = dev_task
        self.final_tasks = list(final_tasks)
        self.batch_size = batch_size
        self.evaluate_before_training = evaluate_before_training
        self.score_best_at_end = score_best_at_end
        self.provenance = dict(provenance or {})
        self.history: list[dict] = []

    def score(self, module, tasks: list[str]) -> tuple[dict, Encoder, list[Pooler]]:
        """(evaluate_sts result, the encoder and the poolers that produced it), in eval mode."""
        was_training = module.training
        module.eval()
        try:
            encoder, poolers = module.evaluation_encoder(self.batch_size), module.eval_poolers()
            result = evaluate_sts(encoder, get_tasks(tasks), resolve_data_root(self.data_root), poolers,
                                  module.eval_template, module.hparams.sentence_rule)
            return result, encoder, poolers
        finally:
            module.train(was_training)

    def _dev_scores(self, trainer, module) -> dict[str, float]:
        started = time.perf_counter()
        scores = self.score(module, [self.dev_task])[0]["scores"]
        values = {pooler: row[self.dev_task] for pooler, row in scores.items()}
        self.history.append({"step": trainer.global_step, **values, "seconds": time.perf_counter() - started})
        log.info("step %d: %s", trainer.global_step, ", ".join(f"{k} {v:.2f}" for k, v in values.items()))
        if trainer.is_global_zero:
            self._write_curve()
        return values

    def _metric(self, pooler: str) -> str:
        return f"val/{self.dev_task.lower().replace('stsbenchmark-', 'stsb_')}/{pooler}"

    def on_train_start(self, trainer, module) -> None:
        if self.evaluate_before_training and trainer.global_step == 0:
            values = self._dev_scores(trainer, module)
            for logger in trainer.loggers:
                logger.log_metrics({self._metric(p): v for p, v in values.items()}, step=0)

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        if step == 0 or step % self.every_n_steps or (self.history and self.history[-1]["step"] == step):
            return
        for pooler, value in self._dev_scores(trainer, module).items():
            module.log(self._metric(pooler), value, on_step=True, on_epoch=False, prog_bar=pooler == "mask")

    def on_fit_end(self, trainer, module) -> None:
        if not self.score_best_at_end or trainer.interrupted:
            return
        checkpoint = getattr(trainer.checkpoint_callback, "best_model_path", "") or ""
        if checkpoint:
            state = torch.load(checkpoint, map_location=module.device, weights_only=False)["state_dict"]
            module.load_state_dict(state)
        started = time.perf_counter()
        result, encoder, poolers = self.score(module, self.final_tasks)
        if not trainer.is_global_zero:
            return
        provenance = scoring_provenance(encoder, module.eval_template, module.hparams.sentence_rule, None, poolers)
        best_score = trainer.checkpoint_callback.best_model_score if checkpoint else None
        provenance["model"].update(checkpoint=checkpoint or "final weights (no checkpoint selected)",
                                   selected_on=self._metric("mask"),
                                   best_dev=float(best_score) if best_score is not None else None)
        provenance.update(tasks=result["tasks"], wall_time_s=round(time.perf_counter() - started, 2),
                          **self.provenance)
        write_report(self.output_dir, {"scores": result["scores"], "details": result["details"],
                                       "provenance": provenance})
        log.info("final scores written to %s", self.output_dir / "results.md")
        log_sts_tables(trainer.loggers, result, step=trainer.global_step, image_path=self.output_dir / "results.png")

    def _write_curve(self) -> None:
        atomic_write_json(self.output_dir / "curve.json", {"metric": self._metric("<pooler>"),
                                                           "points": self.history})
        if len(self.history) > 1:
            plot_curve(self.history, self.output_dir / "curve.png", f"{self.dev_task} Spearman x100 vs step")
