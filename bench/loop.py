"""The real training loop for the benches: train.py's `train(settings)` (its composition, checks, run folder and the
Lightning Trainer with the configured precision, compile, optimiser and clipping), with one more callback that
measures, and without evaluations or checkpoints inside the measured steps."""

from __future__ import annotations

from pathlib import Path

import pytorch_lightning as pl


def check_overrides(overrides: list[str]) -> None:
    """A bench's train.py overrides, refused as train.py refuses them, before the bench does any work (one line each):
    its command-line checks (misspelt keys, group options, experiments) and its settings' check of the composed
    config (unknown keys at any depth, types, values); the model and data files are left to the run, since a bench
    may write them first (`--random-bert`, `--distinct-lengths`)."""
    from promptemb.training.command_line import check_train_command

    check_train_command(overrides, composition_only=True)


def bench_overrides(overrides: list[str], work: Path, max_steps: int) -> list[str]:
    """`overrides` plus: the run in `work`, `max_steps` steps, no STS-B dev evaluation before, during or after
    training (their varying shapes and their time are not the step's), no periodic checkpoint."""
    return [*overrides, f"output_dir={work / 'run'}", f"trainer.max_steps={max_steps}",
            "callbacks.sts_evaluation.evaluate_before_training=false",
            "callbacks.sts_evaluation.score_best_at_end=false", f"eval_every_n_steps={10 ** 6}"]


def train_with(overrides: list[str], callback: pl.Callback, work: Path, max_steps: int) -> pl.Trainer:
    """Run train.py's `train(settings)` on `bench_overrides(...)` with `callback` added to the trainer's callbacks."""
    from hydra.core.global_hydra import GlobalHydra

    from promptemb.training import runner
    from promptemb.training.command_line import checked, compose_train

    settings = checked(compose_train(bench_overrides(overrides, work, max_steps)))
    GlobalHydra.instance().clear()
    build = runner.build

    def build_with_callback(node, **kwargs):  # the trainer gets the extra callback; nothing else changes
        if "callbacks" in kwargs:
            kwargs["callbacks"] = [*kwargs["callbacks"], callback]
        return build(node, **kwargs)

    runner.build = build_with_callback
    try:
        return runner.train(settings)
    finally:
        runner.build = build
