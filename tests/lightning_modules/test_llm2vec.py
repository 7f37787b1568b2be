"""LLM2Vec's recipes: MNTP's masking, loss and LoRA gradients against the official run_mntp.py computation
(tests/llm2vec_0.2.3.json `mntp`, made by tests/llm2vec_official_references.py with llm2vec 0.2.3 and
transformers 4.44.2), to <= 1e-4 of the official tensor's largest entry; the refusals before any weight loads."""

from __future__ import annotations

import pytest
import torch

from promptemb.common.errors import ConfigError
from promptemb.lightning_modules.llm2vec import LLM2VecContrastive, LLM2VecMNTP
from tests.decoder_helpers import save_tiny_decoder
from tests.helpers import assert_close_scaled
from tests.llm2vec_official_references import MNTP_MAX_LENGTH, SENTENCES, lora_key, seed_lora
from tests.poolers.test_llm2vec import REFERENCE, save_reference_model
from tests.training.test_train import nli_csv  # noqa: F401 (a fixture)

RTOL = 1e-4
CASES = REFERENCE["mntp"]


@pytest.fixture(scope="module", params=CASES, ids=lambda case: f"{case['family']}-{case['data_collator_type']}")
def mntp(request, tmp_path_factory):
    case = request.param
    directory = save_reference_model(tmp_path_factory.mktemp(f"mntp_{case['family']}"), case["family"])
    module = LLM2VecMNTP(str(directory), mlm_probability=case["mlm_probability"],
                         data_collator=case["data_collator_type"], lora_r=case["lora_r"],
                         lora_alpha=case["lora_alpha"], lora_dropout=0.0, max_sentence_tokens=MNTP_MAX_LENGTH)
    seed_lora(module.transformer)
    module.train()
    return case, module


def test_mask_token_and_masking_match_official(mntp):
    """Mask token `_` (mask_token_type blank); with the official seed the same tokens are chosen, masked and
    randomised (right padding with EOS, padding and <s> never chosen)."""
    case, module = mntp
    assert module.mask_id == case["mask_token_id"]
    torch.manual_seed(REFERENCE["seed"])
    batch = module.mntp_batch(SENTENCES)
    assert batch["input_ids"].tolist() == case["input_ids"]
    assert batch["labels"].tolist() == case["labels"]
    assert batch["attention_mask"].tolist() == case["attention_mask"]


def test_loss_and_lora_gradients_match_official(mntp):
    case, module = mntp
    module.zero_grad()
    loss = module.mntp_forward(torch.tensor(case["input_ids"]), torch.tensor(case["attention_mask"]),
                               torch.tensor(case["labels"]))
    loss.backward()
    assert_close_scaled(loss.detach().reshape(1), torch.tensor([case["loss"]]), RTOL, msg="loss")
    grads = {lora_key(name): p.grad for name, p in module.transformer.named_parameters() if "lora_" in name}
    assert sorted(grads) == sorted(case["lora_grads"])
    for key, expected in case["lora_grads"].items():
        assert_close_scaled(grads[key], torch.tensor(expected), RTOL, msg=key)


def test_mntp_on_an_encoder_is_refused_before_its_weights_load(tiny_bert, monkeypatch):
    import transformers

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained",
                        lambda *a, **k: pytest.fail("weights loaded"))
    with pytest.raises(ConfigError, match=r"^LLM2VecMNTP trains a decoder \(causal LM\) with bidirectional "
                                          r"attention; model .* is 'bert', an encoder") as caught:
        LLM2VecMNTP(str(tiny_bert))
    assert "\n" not in str(caught.value)


def test_unsupported_family_and_bad_arguments_are_one_line(tmp_path):
    gpt2 = save_tiny_decoder(tmp_path / "gpt2", "gpt2", layers=2)
    with pytest.raises(ConfigError, match=r"^LLM2VecContrastive needs bidirectional attention, which runs on "
                                          r"llama, mistral, qwen2, gemma decoders .* but the model is 'gpt2'$"):
        LLM2VecContrastive(str(gpt2))
    for kwargs, pattern in [({"data_collator": "wwm"}, r"unknown data_collator 'wwm'; valid: default, all_mask"),
                            ({"mask_token_type": "mask"}, r"unknown mask_token_type 'mask'"),
                            ({"pooling_mode": "cls"}, r"LLM2Vec has no pooling mode 'cls'")]:
        with pytest.raises(ConfigError, match=pattern):
            LLM2VecMNTP(str(gpt2), **kwargs)


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    return save_tiny_decoder(tmp_path_factory.mktemp("llama"), "llama", layers=2, hidden=32)


@pytest.mark.parametrize("name", ["llm2vec_mntp", "quickstart_llm2vec_mntp", "llm2vec_simcse",
                                  "quickstart_llm2vec_simcse", "llm2vec_sup", "quickstart_llm2vec_sup"])
def test_experiments_train_through_the_trainer(name, tiny_llama, real_data_root, tmp_path, nli_csv):  # noqa: F811
    """train.py's path (compose, the one check, `train`) with fast_dev_run on a tiny LLaMA: the final table holds
    the recipe's LLM2Vec pooling of the trained model."""
    import json

    from promptemb.training.runner import train
    from tests.training.test_train import checked, compose_train, tiny_overrides

    out = tmp_path / "out"
    cfg = compose_train([*tiny_overrides(name, tiny_llama, real_data_root, out, nli_csv), "debug=fdr"])
    trainer = train(checked(cfg))
    assert trainer.state.finished and trainer.global_step == 1
    results = json.loads((out / "results.json").read_text())
    assert "mask" in results["scores"] and -100 <= results["scores"]["mask"]["STSBenchmark"] <= 100
    assert results["provenance"]["config"]["model"]["_target_"] == cfg.model._target_


@pytest.mark.parametrize("case", REFERENCE["losses"], ids=lambda c: f"scale{c['scale']:g}-{len(c['inputs'])}")
def test_contrastive_loss_is_the_official_hard_negative_nll(case):
    """InfoNCE at temperature 1/scale equals `HardNegativeNLLLoss` (SimCSE's scale 20, the supervised default 50):
    loss and the gradient of every input."""
    from promptemb.lightning_modules.losses import info_nce

    inputs = [torch.tensor(values, requires_grad=True) for values in case["inputs"]]
    loss = info_nce(inputs[0], inputs[1], 1 / case["scale"], inputs[2] if len(inputs) == 3 else None)
    loss.backward()
    assert_close_scaled(loss.detach().reshape(1), torch.tensor([case["loss"]]), RTOL, msg="loss")
    for tensor, expected in zip(inputs, case["grads"]):
        assert_close_scaled(tensor.grad, torch.tensor(expected), RTOL)


def test_simcse_views_are_two_dropout_draws_of_the_bidirectional_mean(tiny_llama):
    """The SimCSE step embeds each sentence twice (attention dropout makes the views differ) with the evaluation's
    pooler; in eval mode both views equal `embed`, which equals evaluate.py's llm2vec_mean of the same model."""
    from promptemb.encoder.model import Encoder
    from promptemb.poolers import build_pooler

    module = LLM2VecContrastive(str(tiny_llama), attention_dropout=0.3, lora_r=2, lora_alpha=4)
    sentences = SENTENCES[:4]
    module.train()
    first, second, negatives = module.contrastive_views(sentences)
    assert negatives is None and (first - second).abs().max() > 1e-4
    module.eval()
    with torch.no_grad():
        first, second, _ = module.contrastive_views(sentences)
    assert_close_scaled(first, second, 1e-6)
    encoder = Encoder.from_model(module.transformer, module.tokenizer, name=str(tiny_llama))
    expected = encoder.embed(sentences, [build_pooler("llm2vec_mean")])["llm2vec_mean"]
    assert_close_scaled(module.embed(sentences), torch.as_tensor(expected), 1e-5)


def test_mntp_adapter_is_merged_before_the_contrastive_adapter(tiny_llama, tmp_path):
    """run_simcse.py's `merge_peft=True`: the contrastive stage starts from the MNTP adapter folded into the base (its
    own LoRA starts at B = 0), so its embeddings are the MNTP model's; another base is refused in one line."""
    from promptemb.common.errors import DataError

    mntp = LLM2VecMNTP(str(tiny_llama), lora_r=2, lora_alpha=4, lora_dropout=0.0)
    seed_lora(mntp.transformer)
    path = tmp_path / "mntp.ckpt"
    state = {key: value for key, value in mntp.state_dict().items() if "lora_" in key}
    torch.save({"state_dict": state, "hyper_parameters": dict(mntp.hparams),
                "promptemb_adapter": {"base_model": str(tiny_llama),
                                      "base_weights_sha256": mntp.base_weights_sha256}}, path)
    contrastive = LLM2VecContrastive(str(tiny_llama), mntp_adapter=str(path), lora_r=2, lora_alpha=4)
    sentences = SENTENCES[:4]
    assert_close_scaled(contrastive.embed(sentences), mntp.embed(sentences), 1e-5)
    other = save_tiny_decoder(tmp_path / "other", "llama", layers=2, hidden=32, seed=1)
    with pytest.raises(DataError, match=r"was trained on other base weights"):
        LLM2VecContrastive(str(other), mntp_adapter=str(path))
