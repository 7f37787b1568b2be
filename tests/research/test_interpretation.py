"""[MASK] predictions against the Hugging Face MLM forward; refusal without an MLM head; static-token bias counts
and statistics against plain loops."""

import json
from collections import Counter

import numpy as np
import pytest
import torch
from scipy.stats import spearmanr
from transformers import BertForMaskedLM

from promptemb.encoder.model import Encoder
from promptemb.encoder.template import Template
from promptemb.research import mask_predictions, token_bias
from tests.helpers import MINILM

PROMPT = 'This sentence : "[X]" means [MASK] .'
SENTENCES = ["a man is playing a guitar .", "the cat sleeps"]


def test_mask_predictions_match_the_mlm_forward(tiny_bert):
    encoder = Encoder(str(tiny_bert), batch_size=1, mlm_head=True, progress=False)
    rows = mask_predictions.predict(encoder, SENTENCES, Template(PROMPT), top_k=4)
    model = BertForMaskedLM.from_pretrained(tiny_bert).eval()
    tokenizer = encoder.tokenizer
    for row, sentence in zip(rows, SENTENCES):
        ids = tokenizer(PROMPT.replace("[X]", sentence))["input_ids"]
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0, ids.index(tokenizer.mask_token_id)]
        probs = torch.softmax(logits.double(), -1)
        top = torch.topk(probs, 4)
        assert [p["token"] for p in row["predictions"]] == tokenizer.convert_ids_to_tokens(top.indices.tolist())
        np.testing.assert_allclose([p["probability"] for p in row["predictions"]], top.values.numpy(), rtol=1e-4)


def test_mask_predictions_cli_and_refusal_without_mlm_head(tiny_bert, tmp_path, capsys):
    mask_predictions.main(["--model", str(tiny_bert), "--sentences", *SENTENCES, "--top-k", "3",
                           "--output-dir", str(tmp_path / "ok")])
    record = json.loads((tmp_path / "ok/mask_predictions.json").read_text())
    assert [len(row["predictions"]) for row in record["predictions"]] == [3, 3]
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        mask_predictions.main(["--model", MINILM, "--sentences", "hi", "--output-dir", str(tmp_path / "no")])
    assert exit_info.value.code != 0
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "has no trained MLM head" in errors[0]
    assert not (tmp_path / "no").exists()


def test_token_counts_and_bias_statistics(tiny_bert, tmp_path):
    encoder = Encoder(str(tiny_bert), progress=False)
    tokenizer = encoder.tokenizer
    corpus = ["a dog runs .", "a dog sleeps", "Unbelievable things"]
    counts = token_bias.token_counts(tokenizer, corpus)
    hand = Counter(t for s in corpus for t in tokenizer(s, add_special_tokens=False)["input_ids"])
    assert {i: int(counts[i]) for i in np.flatnonzero(counts)} == dict(hand)
    groups = token_bias.token_groups(tokenizer)
    vocab = tokenizer.convert_tokens_to_ids
    assert groups["subword"][vocab("##s")] and not groups["subword"][vocab("dog")]
    assert not groups["analysed"][vocab("[CLS]")] and not groups["analysed"][vocab("[unused0]")]
    upper = np.flatnonzero(groups["uppercase"] & groups["analysed"])  # uncased vocab: only the letter ℝ counts
    assert tokenizer.convert_ids_to_tokens(upper.tolist()) == ["ℝ", "##ℝ"]
    table = encoder.transformer.get_input_embeddings().weight.detach().numpy()
    stats = token_bias.bias_statistics(table, counts, groups)
    keep = groups["analysed"]
    norms = [float(np.sqrt(sum(v * v for v in row))) for row in table[keep]]
    assert stats["spearman_logfreq_norm"] == pytest.approx(spearmanr(np.log1p(counts[keep]), norms).statistic)
    assert stats["tokens_seen_in_corpus"] == len(hand)
    assert stats["counts"]["uppercase"] == 2
    png = token_bias.plot_bias(table, counts, groups, tmp_path / "bias.png", "tiny")
    assert png.read_bytes()[:4] == b"\x89PNG"
