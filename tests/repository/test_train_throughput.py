"""bench/train_throughput.py: the FLOP model against a hand count, one short run end to end (the real loop and the
phases), CUDA refused in one line without a CUDA device."""

from __future__ import annotations

import json

import pytest
import torch

from bench.train_throughput import FlopCounter, main
from promptemb.lightning_modules.promptbert import PromptBERTUnsup

SENTENCES = ["a man plays a guitar .", "short", "two dogs run in a field", "short"]


def test_flop_count_matches_the_formula_per_row(tiny_bert):
    module = PromptBERTUnsup(str(tiny_bert)).train()
    counter = FlopCounter(module)
    counter.counting = True
    try:
        module.contrastive_loss(SENTENCES)
    finally:
        counter.close()
    flops, sentence_tokens, _ = counter.totals()
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
    assert sentence_tokens == tokens
    assert flops == expected


def test_short_run_writes_every_figure(tiny_bert, real_data_root, tmp_path, capsys):
    from tests.training.test_train import WIKI_SAMPLE

    out = tmp_path / "result.json"
    main([f"backbone.name_or_path={tiny_bert}", "experiment=quickstart_unsup", f"data_root={real_data_root}",
          f"data.files=[{WIKI_SAMPLE}]", "data.batch_size=4", "data.max_examples=16",
          f"data.cache_dir={tmp_path}", "model.grad_cache_chunk_size=2",
          "trainer.precision=bf16-mixed", "--steps", "2", "--warmup", "1", "--device", "cpu", "--peak-tflops", "1",
          "--out", str(out)])
    result = json.loads(out.read_text())
    phases, loop = result["phases"], result["loop"]
    assert abs(sum(phases["phase_fraction"].values()) - 1) < 1e-9
    assert result["setup"]["pretokenize"] and phases["phase_seconds_mean"]["inputs"] > 0  # ids wrapped in the step
    fractions = phases["phase_fraction"]
    assert phases["data_fraction"] == pytest.approx(fractions["data_wait"] + fractions["inputs"])
    for part in (phases, loop):
        assert part["steps_per_s"] > 0 and part["real_tokens_per_s"] > 0 and part["model_flops_per_step"] > 0
        assert part["mfu"] == part["achieved_tflops"]
    # the same batches (same seed and order) in both: the same work per step
    assert loop["model_flops_per_step"] == phases["model_flops_per_step"]
    assert loop["steps"] == 2 and loop["warmup_seconds"] > 0
    assert result["measured_by"] == "loop" and result["steps_per_s"] == loop["steps_per_s"]
    assert result["setup"]["grad_cache_chunk_size"] == 2 and result["setup"]["precision"] == "bf16-mixed"
    printed = capsys.readouterr().out
    assert "loop (train.py's, no synchronisation inside)" in printed and "steps/s" in printed


def test_cuda_is_refused_in_one_line_without_a_cuda_device(capsys):
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    with pytest.raises(SystemExit) as exited:
        main(["experiment=quickstart_unsup", "--device", "cuda"])
    assert exited.value.code == ("error: --device cuda: this machine has no CUDA device; use --device cpu "
                                 "(or auto)")


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
