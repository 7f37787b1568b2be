"""The training step in the real loop (train.py's `train(settings)`, the Lightning Trainer): one host
synchronisation per optimiser step (the divergence guard's copy of the loss), and an operator count that does not
depend on how many distinct sentence lengths a batch holds. Counted by bench/step_counts.py (the step's device
emulated on the CPU)."""

from __future__ import annotations

import pytest

from bench.loop import train_with
from bench.step_counts import CountSteps, write_corpus
from tests.training.test_train import WIKI_SAMPLE

#: The one synchronisation left: the loss copied to the host for the guard, the progress bar and the loggers.
GUARD = "Tensor.to(cpu) @ lightning_modules/base.py"


def counted(tiny_bert, data_root, work, *overrides: str, steps: int = 2):
    counter = CountSteps(steps=steps, skip=1)
    common = [f"backbone.name_or_path={tiny_bert}", f"data_root={data_root}", "trainer.accelerator=cpu",
              "data.num_workers=0", f"data.cache_dir={work / 'cache'}"]
    train_with([*overrides, *common], counter, work, 1 + steps + 1)  # the window ends where the next step starts
    return counter.counts.per_step()


@pytest.mark.parametrize("recipe", [
    ["experiment=quickstart_unsup"],
    pytest.param(["experiment=quickstart_unsup", "data.pretokenize=false"],  # raw sentences tokenized in the step
                 marks=pytest.mark.slow),
    pytest.param(["experiment=quickstart_unsup", "model.freeze_bias=true"], marks=pytest.mark.slow),
    ["experiment=quickstart_sup", "data.batch_size=4"],  # triplets, one template, denoised
    pytest.param(["experiment=quickstart_optiprompt", "model.denoise=true"],  # soft template in sentence and bias rows
                 marks=pytest.mark.slow),
])
def test_one_host_synchronisation_per_step(recipe, tiny_bert, real_data_root, tmp_path):
    data = [] if "quickstart_sup" in recipe[0] else [
        "data.download=null", f"data.files=[{WIKI_SAMPLE}]", "data.max_examples=64", "data.batch_size=8"]
    counts = counted(tiny_bert, real_data_root, tmp_path, *recipe, *data)
    assert counts["steps"] == 2
    assert list(counts["syncs"]) == [next(where for where in counts["syncs"] if where.startswith(GUARD))]
    assert counts["syncs_per_step"] == 1
    assert counts["host_scalar_reads_per_step"] > 0  # the progress bar reads the host copy; the optimiser its steps


def test_operator_count_does_not_grow_with_the_distinct_lengths_of_a_batch(tiny_bert, real_data_root, tmp_path):
    """Batches of 32 sentences of one token count, then of 16 distinct ones: the same operators per step (the bias
    rows are planned on the host; only their number of rows differs)."""
    counts = {}
    for distinct in (1, 16):
        work = tmp_path / str(distinct)
        work.mkdir()
        corpus = write_corpus(work / "corpus.txt", distinct, lines=256)
        counts[distinct] = counted(tiny_bert, real_data_root, work, "experiment=quickstart_unsup",
                                   "data.download=null", f"data.files=[{corpus}]", "data.batch_size=32")
    assert counts[1]["dispatches_per_step"] == counts[16]["dispatches_per_step"]
    assert counts[1]["syncs_per_step"] == counts[16]["syncs_per_step"] == 1
