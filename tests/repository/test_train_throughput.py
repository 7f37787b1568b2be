"""bench/train_throughput.py: the FLOP model against a hand count, and one short run end to end."""

from __future__ import annotations

import json

import pytest
import torch

from bench.train_throughput import Clock, FlopCounter, main
from promptemb.lightning_modules.promptbert import PromptBERTUnsup

SENTENCES = ["a man plays a guitar .", "short", "two dogs run in a field", "short"]


def test_flop_count_matches_the_formula_per_row(tiny_bert):
    module = PromptBERTUnsup(str(tiny_bert)).train()
    counter = FlopCounter(module, Clock(torch.device("cpu")))
    counter.counting = True
    module.contrastive_loss(SENTENCES)
    config = module.transformer.config
    layers, d, f = config.num_hidden_layers, config.hidden_size, config.intermediate_size
    params = layers * (4 * d * d + 2 * d * f)

    def forward(n):
        return 2 * params * n + 4 * layers * d * n * n

    expected, tokens = 0, 0
    for builder in module.builders:  # two views, every sentence; bias rows: template alone, one per distinct length
        items = builder.build(SENTENCES)
        tokens += sum(len(item.input_ids) for item in items)
        expected += 3 * sum(forward(len(item.input_ids)) for item in items)
        bias_width = 2 + len(builder.prefix_ids) + len(builder.suffix_ids)
        expected += 3 * len({item.sentence_length for item in items}) * forward(bias_width)
    assert counter.sentence_tokens == tokens
    assert counter.flops == expected


def test_short_run_writes_every_figure(tiny_bert, real_data_root, tmp_path, capsys):
    from tests.training.test_train import WIKI_SAMPLE

    out = tmp_path / "result.json"
    main([f"backbone.name_or_path={tiny_bert}", "experiment=quickstart_unsup", f"data_root={real_data_root}",
          f"data.files=[{WIKI_SAMPLE}]", "data.batch_size=4", "data.max_examples=16",
          f"data.cache_dir={tmp_path}", "model.grad_cache_chunk_size=2",
          "trainer.precision=bf16-mixed", "--steps", "2", "--warmup", "1", "--device", "cpu", "--peak-tflops", "1",
          "--out", str(out)])
    result = json.loads(out.read_text())
    assert abs(sum(result["phase_fraction"].values()) - 1) < 1e-9
    assert result["setup"]["pretokenize"] and result["phase_seconds_mean"]["inputs"] > 0  # ids wrapped in the step
    fractions = result["phase_fraction"]
    assert result["data_fraction"] == pytest.approx(fractions["data_wait"] + fractions["inputs"])
    assert result["steps_per_s"] > 0 and result["real_tokens_per_s"] > 0 and result["model_flops_per_step"] > 0
    assert result["mfu"] == result["achieved_tflops"]
    assert result["setup"]["grad_cache_chunk_size"] == 2 and result["setup"]["precision"] == "bf16-mixed"
    assert "steps/s" in capsys.readouterr().out


@pytest.mark.parametrize("pretokenize", ["true", "false"])
def test_data_only_times_the_data_path(pretokenize, tiny_bert, real_data_root, tmp_path, capsys):
    from tests.training.test_train import WIKI_SAMPLE

    out = tmp_path / "data.json"
    main([f"backbone.name_or_path={tiny_bert}", "experiment=quickstart_unsup", f"data_root={real_data_root}",
          f"data.files=[{WIKI_SAMPLE}]", "data.batch_size=4", "data.max_examples=16", f"data.cache_dir={tmp_path}",
          f"data.pretokenize={pretokenize}", "--data-only", "5", "--device", "cpu", "--out", str(out)])
    result = json.loads(out.read_text())
    assert result["batches"] == 5 and result["data_wait_ms"] > 0 and result["inputs_ms"] > 0
    assert result["data_path_ms"] == pytest.approx(result["data_wait_ms"] + result["inputs_ms"])
    assert (tmp_path / "pretokenized").is_dir() == (pretokenize == "true")
    assert "ms per batch" in capsys.readouterr().out
