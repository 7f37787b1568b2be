"""Code paths that only a GPU run takes, exercised on the CPU by emulating the GPU-only condition (each test says how):
final scoring on the training device, gradient caching under autocast, resuming on fewer devices, ..."""

from __future__ import annotations

from types import SimpleNamespace

import pytorch_lightning as pl
import torch

from promptemb.callbacks.sts_evaluation import STSEvaluationCallback

ACCELERATOR = torch.device("cuda", 0)


class EmulatedAcceleratorModule(pl.LightningModule):
    """A LightningModule that pretends to move: `to(device)` only records the device (a CPU-only machine has no
    second device to move to), and `device` reports it, as Lightning's own device tracking does."""

    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(2, 2)
        self.sent_to: list[torch.device] = []

    def to(self, device, *args, **kwargs):
        self.sent_to.append(torch.device(device))
        self._device = torch.device(device)
        return self

    def cpu(self):
        return self.to("cpu")


def test_final_scoring_runs_on_the_training_device_not_where_teardown_left_the_module(tmp_path, monkeypatch):
    """Lightning's Strategy.teardown() moves the module to the CPU before on_fit_end: the final scoring must move it
    back to the strategy's root device (emulated: a module whose moves are recorded), then return it to the CPU."""
    module = EmulatedAcceleratorModule()
    module.cpu()  # what Strategy.teardown() does before on_fit_end
    callback = STSEvaluationCallback(output_dir=str(tmp_path), final_tasks=["STSBenchmark"])
    scored_on = []
    monkeypatch.setattr(callback, "_score_final", lambda trainer, scored, checkpoint: scored_on.append(scored.device))
    trainer = SimpleNamespace(checkpoint_callback=SimpleNamespace(best_model_path="", best_model_score=None),
                              interrupted=False, is_global_zero=True, loggers=[], global_step=3,
                              strategy=SimpleNamespace(root_device=ACCELERATOR))
    callback.on_fit_end(trainer, module)
    assert scored_on == [ACCELERATOR]
    assert module.device == torch.device("cpu")  # handed back where teardown left it
