"""Scores the model being trained with the evaluation spine (same Encoder, poolers and scorer as evaluate.py).

* every `every_n_steps` optimiser steps (and once before training): STS-B dev with the module's evaluation poolers
  ([MASK] and avg at least) plus `dev_poolers`, logged as `val/stsb_dev/<pooler>` so ModelCheckpoint can select on
  it;
* at the end of fit: the best checkpoint (by the monitored metric) on `final_tasks` (default the 7 STS tasks; task
  groups `transfer` / `clustering` add those families) with the module's poolers AND
  every configured training-free pooler (`poolers`, e.g. [mean, first_last, ditto, sbert_wk, idf]), each raw and
  through every post-processor in `post` (fitted on `fit_corpus`), all from one forward pass per input form;
  written as results.json, results.md and results.png, plus the dev curve (curve.json / curve.png).
Under DDP the dev evaluation is spread over all ranks (`shard_evaluation`: each encodes a share of the batches,
all exchange embeddings and score; the numbers equal one process's) and rank 0's numbers are broadcast; the final
scoring runs on rank 0 alone, on its training device. Only rank 0 writes files.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytorch_lightning as pl
import torch

from promptemb.common.bounds import AtLeastOne
from promptemb.common.device_profile import profile_of
from promptemb.common.errors import ConfigError, DivergenceError
from promptemb.common.instantiate import keywords_of, split_keywords
from promptemb.common.io import atomic_write_json
from promptemb.data.mined_triplets import mined_summary
from promptemb.encoder.model import BATCH_SIZE, Encoder, Shard, attention_implementation, combine_needs
from promptemb.evaluation.plots import plot_curve
from promptemb.evaluation.report import plot_name
from promptemb.evaluation.scoring_options import ScoringOptions
from promptemb.evaluation.session import ScoringSession, ScoringSettings
from promptemb.evaluation.wandb_tables import log_sts_tables
from promptemb.inference.model_sources import merge_poolers
from promptemb.lightning_modules.checkpoint import load_memory_mapped
from promptemb.poolers.base import Pooler

log = logging.getLogger(__name__)
SELECTION_POOLER = "mask"  # the one ModelCheckpoint monitors (configs/callbacks/default.yaml)


@dataclass
class EvaluationPlan:
    """When and on what the callback scores: the dev task every `every_n_steps` optimiser steps (and once before
    training) with the module's poolers plus `dev_poolers`; at the end of fit the best checkpoint on `final_tasks`;
    `shard_evaluation`: under DDP every rank encodes a share of the dev sentences (else rank 0 alone); `batch_size`:
    inputs per encoding batch where batches go by count (the CPU), evaluate.py's default (`BATCH_SIZE`), so evaluate.py
    on a checkpoint gives the bits this callback reported."""

    every_n_steps: AtLeastOne = 125
    dev_task: str = "STSBenchmark-dev"
    dev_poolers: list[str] | tuple[str, ...] = ()
    final_tasks: list[str] | tuple[str, ...] = ("sts",)  # a group of the task registry: the 7 STS tasks
    batch_size: AtLeastOne = BATCH_SIZE
    evaluate_before_training: bool = True
    score_best_at_end: bool = True
    shard_evaluation: bool = True


#: What the flat keys of the callback's config node (configs/callbacks/default.yaml) are split into.
CONFIG_SETTINGS = (ScoringSettings, EvaluationPlan)


class STSEvaluationCallback(pl.Callback):
    def __init__(self, session: ScoringSession, output_dir: str, plan: EvaluationPlan | None = None,
                 provenance: dict | None = None):
        """`session`: what the final scoring scores with, as evaluate.py (poolers, post-processors and their fit
        corpus, task registry, transfer / clustering settings, analysis); the dev evaluation uses its pooler
        arguments too. `plan`: the cadence and the tasks. `provenance`: added to results.json. The config builds it
        with `from_config`."""
        plan = plan or EvaluationPlan()
        self.session = session
        self.output_dir = Path(output_dir)
        self.every_n_steps = plan.every_n_steps
        self.dev_task = plan.dev_task
        self.final_tasks = list(plan.final_tasks)
        self.batch_size = plan.batch_size
        self.evaluate_before_training = plan.evaluate_before_training
        self.score_best_at_end = plan.score_best_at_end
        self.provenance = dict(provenance or {})
        self.history: list[dict] = []
        self.dev_extra_poolers = list(plan.dev_poolers)
        self.shard_evaluation = plan.shard_evaluation
        self.extra_poolers = list(session.settings.poolers)

    @classmethod
    @keywords_of(*CONFIG_SETTINGS)
    def from_config(cls, output_dir: str, data_root: str | None = None, provenance: dict | None = None,
                    **keys) -> STSEvaluationCallback:
        """The callback from its config node's flat keys (`callbacks.sts_evaluation.poolers=...`,
        `callbacks.sts_evaluation.every_n_steps=...`): the scoring group's (`ScoringSettings`, configs/scoring/) and
        the plan's (`EvaluationPlan`). The session is built now, so an unknown pooler, post-processor or argument
        fails at instantiation (model-dependent checks: on_fit_start); the dev poolers may be configured by
        `pooler_args` too."""
        settings, plan = split_keywords(keys, *CONFIG_SETTINGS)
        session = ScoringSession(settings, data_root, other_poolers=plan.dev_poolers, poolers_required=False)
        return cls(session, output_dir, plan, provenance)

    @classmethod
    def check_config(cls, node: dict) -> None:
        """What `from_config` refuses about the scoring (poolers, post-processors, their arguments), and the tasks
        the plan names (read only at step 0 and after the last step), checked with train.py's settings, before any
        model loads."""
        keys = {key: value for key, value in node.items() if key not in ("_target_", "output_dir", "data_root",
                                                                           "provenance")}
        settings, plan = split_keywords(keys, *CONFIG_SETTINGS)
        check_plan_tasks(ScoringSession(settings, None, other_poolers=plan.dev_poolers, poolers_required=False), plan)

    def poolers_for(self, module, extra: list[str]) -> list[Pooler]:
        """The module's evaluation poolers, then each extra one whose name they do not already use."""
        return merge_poolers(module.eval_poolers(), self.session.build_poolers(extra), self.session.pooler_args,
                             "callbacks.sts_evaluation.pooler_args")

    @contextmanager
    def _scoring(self, module, extra_poolers: list[str], shard: Shard | None = None,
                 ) -> Iterator[tuple[Encoder, list[Pooler]]]:
        """The module in eval mode (eager attention while a pooler reads attention probabilities) with its
        evaluation encoder (encoding this process's `shard` of a multi-process encoding) and poolers; the training
        state is restored on exit."""
        was_training = module.training
        module.eval()
        poolers = self.poolers_for(module, extra_poolers)
        attention = "eager" if combine_needs(poolers).attentions else None
        try:
            with attention_implementation(module.transformer, attention):
                encoder = module.evaluation_encoder(self.batch_size)
                encoder.shard = shard
                yield encoder, poolers
        finally:
            module.train(was_training)

    def score(self, module, tasks: list[str], extra_poolers: list[str] | None = None, final: bool = False,
              shard: Shard | None = None) -> tuple[dict, Encoder, list[Pooler], ScoringOptions]:
        """(the scores, the encoder and poolers that produced them, the options they were scored with). `final` adds
        the post-processors, analysis metrics and any task family; with a `shard`, every process of the group must
        call this alike."""
        extra = self.dev_extra_poolers if extra_poolers is None else extra_poolers
        with self._scoring(module, extra, shard) as (encoder, poolers):
            options = self.session.options(module.eval_template, module.hparams.sentence_rule,
                                           post_processors=final, dims=self.final_dims(module) if final else ())
            result = self.session.score(encoder, tasks, poolers, options, full=final)
        return result, encoder, poolers, options

    def on_fit_start(self, trainer, module) -> None:
        """Checks the dev and fit-end poolers against the model (Ditto head in range, attentions, MLM head,
        template) and reads their fit corpora now: a bad pooler argument or a missing corpus file fails before
        training, not after it. Every rank checks, so no rank is left waiting in a collective. Records the run's
        device profile (optimiser implementation, precision, TF32, compile) with the scores."""
        self.provenance["device_profile"] = profile_of(trainer).describe(getattr(module, "optimizer_factory", None))
        requests = [(self.dev_extra_poolers, False)]
        if self.score_best_at_end:
            requests.append((self.extra_poolers, True))
        for extra, final in requests:
            with self._scoring(module, extra) as (encoder, poolers):
                self.session.check(encoder, poolers, module.eval_template, final,
                                   dims=self.final_dims(module) if final else ())

    def final_dims(self, module) -> tuple[int, ...]:
        """The widths the final table scores each pooler at (rows `pooler@d`): the configured `dims`, else the
        Matryoshka widths the module trained (none for a plain run)."""
        if self.session.settings.dims:
            return tuple(self.session.settings.dims)
        matryoshka = getattr(module, "matryoshka", None)
        return matryoshka.dims if matryoshka is not None else ()

    def _dev_scores(self, trainer, module) -> dict[str, float]:
        started = time.perf_counter()
        values = None
        shard = self._shard(trainer)
        if shard is not None or trainer.is_global_zero:
            scores = self.score(module, [self.dev_task], shard=shard)[0]["scores"]
            values = {pooler: row[self.dev_task] for pooler, row in scores.items()}
        # every rank holds the same weights and (sharded) the same embeddings; rank 0's numbers are the ones every
        # rank uses (each rank needs them: ModelCheckpoint monitors the logged metric on every rank)
        values = trainer.strategy.broadcast(values, src=0)
        self.history.append({"step": trainer.global_step, **values, "seconds": time.perf_counter() - started})
        log.info("step %d: %s", trainer.global_step, ", ".join(f"{k} {v:.2f}" for k, v in values.items()))
        if trainer.is_global_zero:
            self._write_curve()
        bad = {pooler: value for pooler, value in values.items() if not math.isfinite(value)}
        if bad:  # raised before ModelCheckpoint's turn: nothing is saved from this state
            pooler, value = next(iter(bad.items()))
            raise DivergenceError(
                f"dev score {self._metric(pooler)} is {value} at step {trainer.global_step}: the model diverged; "
                "stopped without saving, the last good checkpoint stays as it was; lower optimizer.lr or clip "
                "gradients (trainer.gradient_clip_val=1.0)")
        return values

    def _shard(self, trainer) -> Shard | None:
        if not self.shard_evaluation or trainer.world_size < 2 or not torch.distributed.is_initialized():
            return None
        return Shard(trainer.global_rank, trainer.world_size)

    def summary(self) -> str | None:
        """One line on the run: best evaluation (step > 0), the untrained and the final score; a warning when the
        final score is below the untrained one (the run collapsed)."""
        points = [p for p in self.history if SELECTION_POOLER in p]
        if not points:
            return None
        name = self._metric(SELECTION_POOLER)
        trained = [p for p in points if p["step"] > 0] or points
        best = max(trained, key=lambda p: p[SELECTION_POOLER])
        first, final = points[0], points[-1]
        line = (f"best {name} {best[SELECTION_POOLER]:.2f} at step {best['step']} (step {first['step']}: "
                f"{first[SELECTION_POOLER]:.2f}, final step {final['step']}: {final[SELECTION_POOLER]:.2f})")
        if first["step"] == 0 and final["step"] > 0 and final[SELECTION_POOLER] < first[SELECTION_POOLER]:
            line += ("; WARNING: the final dev score is below the untrained model's: training collapsed; "
                     "lower optimizer.lr or clip gradients")
        return line

    def _metric(self, pooler: str) -> str:
        return dev_metric(self.dev_task, pooler)

    def _log(self, trainer, values: dict[str, float], step: int) -> None:
        """Dev scores to every logger at the optimiser step they were taken after (as curve.json and the checkpoint
        names); `module.log` would file them under the batch's index, one step lower. `<metric>_best`, the running
        maximum of the selection pooler over the evaluations ModelCheckpoint sees (step > 0), is what W&B sweeps
        optimise (a run's summary keeps the LAST value logged; the checkpoint kept is the best)."""
        metrics = {self._metric(p): v for p, v in values.items()}
        best = self.best_selection_score()
        if best is not None:
            metrics[self._metric(SELECTION_POOLER) + "_best"] = best
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=step)

    def best_selection_score(self, include_untrained: bool = False) -> float | None:
        """Best dev score of the selection pooler so far: over the evaluations ModelCheckpoint sees (step > 0), or
        also the step-0 one of the untrained model."""
        scores = [point[SELECTION_POOLER] for point in self.history
                  if SELECTION_POOLER in point and (include_untrained or point["step"] > 0)]
        return max(scores) if scores else None

    def state_dict(self) -> dict:
        return {"history": self.history}  # a resumed run keeps its curve and best-so-far

    def load_state_dict(self, state_dict: dict) -> None:
        self.history = list(state_dict.get("history", []))

    def on_train_start(self, trainer, module) -> None:
        if self.evaluate_before_training and trainer.global_step == 0:
            self._log(trainer, self._dev_scores(trainer, module), step=0)

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        if step == 0 or step % self.every_n_steps or (self.history and self.history[-1]["step"] == step):
            return
        values = self._dev_scores(trainer, module)
        for pooler, value in values.items():  # callback_metrics: what ModelCheckpoint monitors, and the progress bar
            module.log(self._metric(pooler), value, on_step=True, on_epoch=False, prog_bar=pooler == SELECTION_POOLER,
                       logger=False)
        self._log(trainer, values, step)

    def on_fit_end(self, trainer, module) -> None:
        if not self.score_best_at_end or trainer.interrupted or not trainer.is_global_zero:
            return
        checkpoint = getattr(trainer.checkpoint_callback, "best_model_path", "") or ""
        # Lightning's Strategy.teardown() has moved the module to the CPU before this hook: scoring there would turn
        # a GPU run's seconds of final scoring into many minutes. Score on the training device, then hand the module
        # back where teardown left it (freeing the accelerator as Lightning intends).
        left_on = module.device
        # the live weights (the final step's) are put back after scoring: whoever holds the module after fit (the
        # caller of train(), an export, a notebook) gets the model that was trained, not silently the best one
        live = {name: tensor.detach().clone() for name, tensor in module.state_dict().items()} if checkpoint else None
        module.to(trainer.strategy.root_device)
        try:
            if checkpoint:
                module.load_state_dict(load_memory_mapped(Path(checkpoint))["state_dict"])  # weights_only=True
            self._score_final(trainer, module, checkpoint)
        finally:
            if live is not None:
                module.load_state_dict(live)
            module.to(left_on)

    def _score_final(self, trainer, module, checkpoint: str) -> None:
        """The 7-task table of the weights `module` holds now (those of `checkpoint`, when one was selected)."""
        started = time.perf_counter()
        result, encoder, poolers, options = self.score(module, self.final_tasks, self.extra_poolers, final=True)
        provenance = self.session.provenance(encoder, options, poolers, result)
        best_score = trainer.checkpoint_callback.best_model_score if checkpoint else None
        provenance["model"].update(checkpoint=checkpoint or "final weights (no checkpoint selected)",
                                   selected_on=self._metric(SELECTION_POOLER),
                                   best_dev=float(best_score) if best_score is not None else None)
        provenance.update(wall_time_s=round(time.perf_counter() - started, 2), **self.provenance)
        if (matryoshka := getattr(module, "matryoshka", None)) is not None:
            provenance["matryoshka"] = matryoshka.describe()  # the widths and weights it was trained with
        if (adaptive := getattr(module, "adaptive_layers", None)) is not None:
            provenance["adaptive_layers"] = adaptive.describe()  # the layers it was trained at (2D Matryoshka)
        if (mined := getattr(getattr(trainer, "datamodule", None), "mined", None)) is not None:
            provenance["training_data_mined"] = mined_summary(mined)  # what mined its hard negatives
        self.session.report(self.output_dir, self.session.record(result, provenance))
        log.info("final scores written to %s", self.output_dir / "results.md")
        for family, family_result in result["families"].items():  # final/sts, final/transfer, final/clustering
            log_sts_tables(trainer.loggers, family_result, key=f"final/{family}", step=trainer.global_step,
                           image_path=self.output_dir / plot_name(family))

    def _write_curve(self) -> None:
        atomic_write_json(self.output_dir / "curve.json", {"metric": self._metric("<pooler>"),
                                                           "points": self.history})
        if len(self.history) > 1:
            plot_curve(self.history, self.output_dir / "curve.png", f"{self.dev_task} Spearman x100 vs step")


def check_plan_tasks(session: ScoringSession, plan: EvaluationPlan, key: str = "callbacks.sts_evaluation") -> None:
    """The dev task is one STS task of the session's registry (the dev curve is its Spearman) and, where the run
    ends with a final table, `final_tasks` names tasks or groups of it: a typo here would surface after training."""
    try:
        dev = session.tasks([plan.dev_task])
    except ConfigError as err:
        raise ConfigError(f"{key}.dev_task={plan.dev_task}: {err}") from None
    if [task.name for task in dev] != [plan.dev_task] or dev[0].family != "sts":
        raise ConfigError(f"{key}.dev_task={plan.dev_task} is not one STS task (the dev curve is one task's "
                          "Spearman): name one, e.g. STSBenchmark-dev")
    if not plan.score_best_at_end:
        return
    if not plan.final_tasks:
        raise ConfigError(f"{key}.final_tasks=[] names no task for the final table: name tasks or groups (e.g. "
                          f"[sts]), or set {key}.score_best_at_end=false for a run without one")
    try:
        final = session.tasks(plan.final_tasks)
    except ConfigError as err:
        raise ConfigError(f"{key}.final_tasks={list(plan.final_tasks)}: {err}") from None
    session.check_family_args(final, plan.final_tasks, f"{key}.final_tasks", f"{key}.")


def dev_metric(dev_task: str, pooler: str) -> str:
    """The name a dev score is logged under (`val/stsb_dev/mask` for STSBenchmark-dev), which checkpoint selection
    monitors."""
    return f"val/{dev_task.lower().replace('stsbenchmark-', 'stsb_')}/{pooler}"
