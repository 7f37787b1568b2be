"""`trainer.compile=true`: the training step's transformer call compiled on inputs padded to a few widths (a
bounded number of graphs), evaluation eager; what it cannot honour refused in one line before any work."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import assert_one_line_error
from tests.run_faults import train_py

#: Longest sentences of 2, 5, 11, 13, 18 and 28 tokens: buckets 8, 8, 16, 16, 32, 32.
BATCHES = [["a cat", "ok"], ["a cat sits on it", "ok"], ["two dogs run in the park today and they are happy", "a"],
           ["two dogs run in the park today and they are very happy now", "a"],
           ["two dogs run in the park today and they are very happy now , really , truly and", "ok"],
           [" ".join(["two dogs run in the park today"] * 4), "a cat"]]


@pytest.mark.slow
def test_the_compiled_step_compiles_one_graph_per_width_and_evaluation_stays_eager(tiny_bert):
    from torch._dynamo.utils import counters

    from promptemb.lightning_modules.promptbert import PromptBERTUnsup

    torch._dynamo.reset()
    module = PromptBERTUnsup(str(tiny_bert)).train()
    module.compile_training_forward()
    assert module.length_buckets == (8, 16, 32)
    widths = []
    module.transformer.register_forward_pre_hook(
        lambda mod, args, kwargs: widths.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True)
    for batch in BATCHES:
        loss, _, to_backward = module.contrastive_loss(batch)
        to_backward(loss).backward()
    segment = 2 + len(module.builders[0].prefix_ids) + len(module.builders[0].suffix_ids)
    assert [width for _, width in widths] == [segment + b for b in (8, 8, 16, 16, 32, 32)]
    assert len(set(widths)) == 3  # rows too: the bias rows are padded to what each width can need
    assert counters["stats"]["unique_graphs"] == 3
    module.eval()
    encoder = module.evaluation_encoder(batch_size=2)
    encoder.embed([s for batch in BATCHES for s in batch], module.eval_poolers(), module.eval_template)
    assert counters["stats"]["unique_graphs"] == 3  # evaluation (other shapes, no gradients) compiled nothing
    assert module.transformer._compiled_call_impl is None


def test_compile_with_the_decoder_recipe_is_refused_in_one_line_before_work(tmp_path, real_data_root):
    from tests.decoder_helpers import save_tiny_decoder

    model = save_tiny_decoder(tmp_path / "llama", "llama")
    out = tmp_path / "run"
    proc = train_py("experiment=quickstart_prompteol_sup", f"backbone.name_or_path={model}", f"output_dir={out}",
                    f"data_root={real_data_root}", "trainer.compile=true")
    assert_one_line_error(proc, r"^error: trainer\.compile=true compiles the training forward of the encoder "
                                r"recipes; PromptEOLSup \(a decoder with LoRA adapters\) trains eager: drop "
                                r"trainer\.compile$", out)
