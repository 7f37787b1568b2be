"""LLM2Vec's recipes: MNTP's masking, loss and LoRA gradients against the official run_mntp.py computation
(tests/llm2vec_0.2.3.json `mntp`, made by tests/llm2vec_official_references.py with llm2vec 0.2.3 and
transformers 4.44.2), to <= 1e-4 of the official tensor's largest entry; the contrastive stages' training step
against run_simcse.py's and run_supervised.py's `compute_loss` (`training`); the refusals before any weight loads."""

from __future__ import annotations

import pytest
import torch

from promptemb.common.errors import ConfigError
from promptemb.lightning_modules.llm2vec import LLM2VecContrastive, LLM2VecMNTP
from tests.decoder_helpers import save_tiny_decoder
from tests.helpers import assert_close_scaled, assert_tensors_close
from tests.llm2vec_official_references import (
    E5_INSTRUCTION,
    MNTP_MAX_LENGTH,
    SENTENCES,
    lora_key,
    seed_lora,
    training_triplets,
)
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


#: the contrastive training step against the official one: reps and loss (float32 forwards of the same
#: computation, positions included: the official ones count the padding)
TRAINING_RTOL = 1e-5


def case_name(case: dict) -> str:
    return f"{case['stage']}-{case['pooling_mode']}"


@pytest.fixture(scope="module")
def reference_llama(tmp_path_factory):
    return save_reference_model(tmp_path_factory.mktemp("l2v_training"), "llama")


def official_recipe(directory, case: dict, **overrides) -> LLM2VecContrastive:
    """The recipe as the reference case trained: LoRA r 4 seeded as the official one, every dropout 0."""
    supervised = case["stage"] == "supervised"
    arguments = {"views": "triplets" if supervised else "dropout", "pooling_mode": case["pooling_mode"],
                 "instruction": E5_INSTRUCTION if supervised else "", "temperature": 1 / case["scale"],
                 "lora_r": case["lora_r"], "lora_alpha": case["lora_alpha"], "lora_dropout": 0.0,
                 "attention_dropout": 0.0, "max_length": case["max_length"], **overrides}
    module = LLM2VecContrastive(str(directory), **arguments)
    seed_lora(module.transformer)
    return module.train()


def training_batch(case: dict) -> list:
    return [texts[0] for texts in case["texts"]] if case["stage"] == "simcse" else training_triplets()


@pytest.mark.parametrize("case", REFERENCE["training"], ids=case_name)
def test_official_training_rows_are_the_collators(reference_llama, case):
    """The rows each official collator hands `LLM2Vec.forward`, one view (column) at a time: the same ids, left
    padding with EOS, attention mask, and `embed_mask` (SimCSE: none, so all zero; supervised: the text after the
    separator, the eos_token end text included, E5's `instruction; ` on the queries not)."""
    from promptemb.encoder.inputs import POOLED
    from promptemb.lightning_modules.llm2vec import official_rows

    module = official_recipe(reference_llama, case)
    builders = module.official_builders
    if case["stage"] == "simcse":
        columns = [(builders["simcse"], training_batch(case))] * 2
    else:
        triplets = training_batch(case)
        columns = [(builders["query" if index == 0 else "document"], [t[index] for t in triplets])
                   for index in range(3)]
    for (builder, texts), expected in zip(columns, case["batches"], strict=True):
        batch = official_rows(builder.build(texts), module.tokenizer.eos_token_id)
        assert batch.input_ids.tolist() == expected["input_ids"]
        assert batch.attention_mask.tolist() == expected["attention_mask"]
        embed_mask = (batch.roles == POOLED).long() if case["stage"] == "supervised" else 0 * batch.roles
        assert embed_mask.tolist() == expected["embed_mask"]


@pytest.mark.parametrize("case", REFERENCE["training"], ids=case_name)
def test_training_step_matches_official_compute_loss(reference_llama, case):
    """`train_pooling=official` (the default): the views' reps, the loss (InfoNCE at τ = 1/scale, the official
    `HardNegativeNLLLoss`) and every LoRA gradient equal the official trainer's `compute_loss` on the same batch,
    to <= 1e-5 of the official tensor's largest entry (gradients 1e-4). SimCSE weighted_mean: zero vectors, the
    loss log N and no gradient, as the official step."""
    module = official_recipe(reference_llama, case)
    module.zero_grad()
    views = [view for view in module.contrastive_views(training_batch(case)) if view is not None]
    loss = module.contrastive_objective(*views, None) if len(views) == 2 else module.contrastive_objective(*views)
    loss.backward()
    assert len(views) == len(case["reps"])
    for index, (view, expected) in enumerate(zip(views, case["reps"], strict=True)):
        assert_close_scaled(view, torch.tensor(expected), TRAINING_RTOL, msg=f"{case_name(case)} reps {index}")
    assert_close_scaled(loss.detach().reshape(1), torch.tensor([case["loss"]]), TRAINING_RTOL, msg="loss")
    grads = {lora_key(name): p.grad for name, p in module.transformer.named_parameters() if "lora_" in name}
    expected = {key: torch.tensor(value) for key, value in case["lora_grads"].items()}
    if all(not tensor.any() for tensor in expected.values()):  # SimCSE weighted_mean: nothing trains
        assert all(grad is None or not grad.any() for grad in grads.values())
        return
    assert_tensors_close(grads, expected, RTOL)


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


@pytest.mark.parametrize("train_pooling", ["official", "evaluation"])
def test_simcse_views_are_two_dropout_draws_of_the_bidirectional_mean(tiny_llama, train_pooling):
    """The SimCSE step embeds each sentence twice (attention dropout makes the views differ); in eval mode both
    views agree. `embed` (what the model is scored with) equals evaluate.py's llm2vec_mean of the same model; so do
    the views with `train_pooling=evaluation`, while the official views average the padding and `<s>` too."""
    from promptemb.encoder.model import Encoder
    from promptemb.poolers import build_pooler

    module = LLM2VecContrastive(str(tiny_llama), attention_dropout=0.3, lora_r=2, lora_alpha=4,
                                train_pooling=train_pooling)
    sentences = SENTENCES[:4]
    module.train()
    first, second, negatives = module.contrastive_views(sentences)
    assert negatives is None and (first - second).abs().max() > 1e-4
    module.eval()
    with torch.no_grad():
        first, second, _ = module.contrastive_views(sentences)
    assert_close_scaled(first, second, 1e-6)
    encoder = Encoder.from_model(module.transformer, module.tokenizer, name=str(tiny_llama))
    expected = torch.as_tensor(encoder.embed(sentences, [build_pooler("llm2vec_mean")])["llm2vec_mean"])
    assert_close_scaled(module.embed(sentences), expected, 1e-5)
    if train_pooling == "evaluation":
        assert_close_scaled(first, expected, 1e-5)
    else:
        assert (first - expected).abs().max() > 1e-2 * expected.abs().max()


def test_unknown_train_pooling_is_one_line_before_any_weight_loads(tiny_llama, monkeypatch):
    import transformers

    monkeypatch.setattr(transformers.AutoModel, "from_pretrained", lambda *a, **k: pytest.fail("weights loaded"))
    with pytest.raises(ConfigError, match=r"^unknown train_pooling 'clean'; valid: official \(as run_simcse\.py / "
                                          r"run_supervised\.py pool the training views\), evaluation") as caught:
        LLM2VecContrastive(str(tiny_llama), train_pooling="clean")
    assert "\n" not in str(caught.value)


def test_unknown_pooling_mode_from_the_command_line(tmp_path):
    """`train.py experiment=quickstart_llm2vec_simcse model.pooling_mode=cls`: one line, exit 2, before any weight
    loads (the model directory has none) and nothing written."""
    from tests.helpers import assert_one_line_error
    from tests.training.test_train import run_train

    model = save_reference_model(tmp_path / "config_only", "llama")
    for weights in model.glob("*.safetensors"):
        weights.unlink()
    out = tmp_path / "out"
    proc = run_train("experiment=quickstart_llm2vec_simcse", f"backbone.name_or_path={model}",
                     "model.pooling_mode=cls", f"output_dir={out}")
    assert_one_line_error(proc, r"^error: LLM2VecContrastive: LLM2Vec has no pooling mode 'cls'; valid: mean, "
                                r"weighted_mean, eos_token, last_token, bos_token$", out)


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


# -- gradient caching and 2-rank DDP ------------------------------------------------------------------------------
#: The modules below are float64 (tests/llm2vec_ddp_worker.py `build`) but for InfoNCE's fp32 logits (losses.py)
#: and MNTP's fp32 cross-entropy. Chunked, cached and per-rank forwards hand InfoNCE the same embeddings up to
#: float64 round-off (~1e-16, far below the fp32 rounding of the logits' inputs, so the same fp32 logits): loss and
#: gradients agree to float64 round-off, observed <= 2e-15 of a tensor's largest entry (the loss: the same bits).
#: A wrong gradient (a missing world-size factor, a rank's negatives left out, an unreplayed chunk) is off by far
#: more. As tests/lightning_modules/test_grad_cache.py: relative to each tensor's largest entry, or to the largest
#: of all where a tensor is zero in exact arithmetic (assert_tensors_close); the loss to the logits' scale 1/τ.
DDP_TOL = 1e-9
LOGIT_SCALE = 1 / 0.05  # 1/τ, LLM2VecContrastive's default temperature


def contrastive_step(module, batch, seed: int = 1) -> tuple[torch.Tensor, int, dict[str, torch.Tensor]]:
    """What Lightning back-propagates for one training step of one process: (loss, rows, LoRA gradients)."""
    module.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    loss, rows, to_backward = module.contrastive_loss(batch)
    to_backward(loss).backward()
    grads = {name: p.grad.clone() for name, p in module.named_parameters() if p.requires_grad}
    assert grads and all("lora_" in name and g.abs().sum() > 0 for name, g in grads.items())  # A and B both learn
    return loss.detach(), rows, grads


@pytest.mark.parametrize("chunk", [1, 2])
@pytest.mark.parametrize("views", ["triplets", "dropout"])
def test_gradient_caching_gives_the_full_batch_loss_and_lora_gradients(tiny_llama, views, chunk):
    """5 triplets (query, positive, hard negative) or 5 sentences as SimCSE's two views, in chunks of 1 or 2 (a last
    chunk of 1): the loss and every LoRA gradient of the plain step on the whole batch. Attention and LoRA dropout 0,
    so both views and both passes are deterministic and the plain step is the reference."""
    from tests.llm2vec_ddp_worker import SENTENCES as DDP_SENTENCES
    from tests.llm2vec_ddp_worker import TRIPLETS, build

    batch = TRIPLETS[:5] if views == "triplets" else DDP_SENTENCES[:5]
    plain, cached = (contrastive_step(build(LLM2VecContrastive, str(tiny_llama), views=views, attention_dropout=0.0,
                                            grad_cache_chunk_size=size), batch) for size in (None, chunk))
    assert cached[1] == plain[1] == 5
    assert_close_scaled(cached[0], plain[0], 0.0, atol=DDP_TOL * LOGIT_SCALE, msg="loss")
    assert_tensors_close(cached[2], plain[2], DDP_TOL)


def test_gradient_caching_replays_the_simcse_dropout(tiny_llama, monkeypatch):
    """The recipe's SimCSE settings (attention dropout 0.3, LoRA dropout 0.05): the two passes give the loss and
    gradients of the same chunks back-propagated with plain autograd, the same dropout masks drawn in pass 2 as in
    pass 1 (attention dropout inside SDPA and LoRA's own dropout); without the RNG replay they are different."""
    from promptemb.lightning_modules.grad_cache import RngState
    from tests.lightning_modules.test_grad_cache import chunked_with_graph
    from tests.llm2vec_ddp_worker import SENTENCES as DDP_SENTENCES

    module = LLM2VecContrastive(str(tiny_llama), views="dropout", lora_r=2, lora_alpha=4, grad_cache_chunk_size=2)
    seed_lora(module.transformer)
    module.double().train()
    assert module.hparams.attention_dropout == 0.3 and module.hparams.lora_dropout == 0.05
    batch = DDP_SENTENCES[:5]
    # the official views of every chunk are padded to the whole batch's width, in the reference as in the step
    module.view_width = max(len(item.input_ids) for item in module.official_builders["simcse"].build(batch))
    reference = chunked_with_graph(module, batch, 2)
    module.view_width = None
    loss, _, grads = contrastive_step(module, batch)
    assert_close_scaled(loss, reference[0], 0.0, atol=DDP_TOL * LOGIT_SCALE, msg="loss")
    assert_tensors_close(grads, reference[1], DDP_TOL)
    first, second, _ = module.contrastive_views(batch)
    assert (first - second).abs().max() > 1e-3  # dropout really is on: the two views differ
    monkeypatch.setattr(RngState, "restore", lambda self: None)
    unreplayed, _, wrong = contrastive_step(module, batch)
    assert_close_scaled(unreplayed, reference[0], 0.0, atol=DDP_TOL * LOGIT_SCALE, msg="loss")  # same pass 1 ...
    assert max(float((wrong[n] - g).abs().max() / g.abs().max()) for n, g in reference[1].items()) > 1e-2  # ... not 2


def two_rank_runs(kind: str, tiny_llama, out: str) -> tuple[dict, list[dict]]:
    """tests/llm2vec_ddp_worker.py as one process and as 2 gloo ranks: what each saved."""
    import os
    import subprocess
    import sys

    from tests.conftest import REPO
    from tests.training.test_ddp import free_port

    worker, env = str(REPO / "tests" / "llm2vec_ddp_worker.py"), {**os.environ, "TINY_LLAMA": str(tiny_llama)}
    subprocess.run([sys.executable, worker, kind, "0", "1", "0", f"{out}-single"], check=True, timeout=300, env=env)
    port = free_port()
    ranks = [subprocess.Popen([sys.executable, worker, kind, str(r), "2", str(port), f"{out}-ddp"], env=env)
             for r in range(2)]
    assert [p.wait(timeout=300) for p in ranks] == [0, 0]
    return torch.load(f"{out}-single.0"), [torch.load(f"{out}-ddp.{rank}") for rank in range(2)]


def test_two_ranks_equal_one_process_on_the_joined_batch(tiny_llama, tmp_path):
    """LLM2VecContrastive's training_step under real DistributedDataParallel (2 gloo ranks, 4 examples each): the
    hard-negative stage, the same with gradient caching (chunks of 1), and SimCSE's views with dropout 0. InfoNCE
    gathers the other rank's rows as negatives, training_step scales the loss by the world size and DDP averages the
    gradients: every rank logs the joined batch's loss and ends with exactly one process's LoRA gradient on the
    joined 8 examples."""
    from tests.llm2vec_ddp_worker import CONTRASTIVE_CASES

    single, ranks = two_rank_runs("contrastive", tiny_llama, str(tmp_path / "result"))
    for rank in ranks:
        assert sorted(rank, key=str) == sorted(CONTRASTIVE_CASES, key=str)
        for (views, chunk), ddp in rank.items():
            reference = single[(views, None)]
            assert torch.isfinite(ddp["loss"]) and ddp["loss"] > 0
            assert_close_scaled(ddp["loss"], reference["loss"], 0.0, atol=DDP_TOL * LOGIT_SCALE,
                                msg=f"{views} views, chunk {chunk}: loss")
            assert torch.equal(ddp["returned"], 2 * ddp["loss"])  # what training_step hands DDP: loss x world size
            assert torch.equal(reference["returned"], reference["loss"])  # one process: the loss itself
            assert_tensors_close(ddp["grads"], reference["grads"], DDP_TOL)


def test_mntp_under_two_ranks_averages_the_per_rank_token_means(tiny_llama, tmp_path):
    """MNTP under DDP: each rank's loss is the mean over its own masked tokens and training_step returns it
    unscaled (no world-size factor, unlike the contrastive recipes: nothing is gathered across ranks), so DDP's
    averaging leaves the mean of the per-rank gradients, what the official run_mntp.py gets under the Hugging Face
    Trainer's DDP. That is not the token mean over the joined batch unless both ranks mask as many tokens (the
    worker's masks differ in count: 19 and 17 tokens here), whose gradient is the count-weighted average instead."""
    single, ranks = two_rank_runs("mntp", tiny_llama, str(tmp_path / "result"))
    per_rank = [single[0], single[1]]  # one process on each rank's 4 sentences, with that rank's masks
    counts = [int((part["batch"]["labels"] != -100).sum()) for part in per_rank]
    assert counts[0] != counts[1] and min(counts) > 0  # the case where the two means differ
    mean = {name: (per_rank[0]["grads"][name] + per_rank[1]["grads"][name]) / 2 for name in per_rank[0]["grads"]}
    for rank, result in enumerate(ranks):
        ddp = result[rank]
        assert torch.equal(ddp["batch"]["labels"], per_rank[rank]["batch"]["labels"])  # same masks drawn
        assert torch.isfinite(ddp["loss"]) and ddp["loss"] > 0
        # the rank's loss is the single process's on that half (float64 model, fp32 cross-entropy: the same bits)
        assert_close_scaled(ddp["loss"], per_rank[rank]["loss"], DDP_TOL, msg="loss")
        assert torch.equal(ddp["returned"], ddp["loss"])  # not multiplied by the world size
        # DDP's average of the two float64 gradients, (a + b) / 2: observed the same bits
        assert_tensors_close(ddp["grads"], mean, DDP_TOL)
        gap = max(float((ddp["grads"][n] - single["joined"]["grads"][n]).abs().max() / mean[n].abs().max())
                  for n in mean)
        assert gap > 1e-2, gap  # observed 7% of a tensor's largest entry: not the joined batch's token mean
    # ... which is the count-weighted average of the per-rank gradients (MNTP's cross-entropy runs in fp32:
    # round-off of fp32 terms, observed 1.3e-7 of a tensor's largest entry)
    weighted = {name: (counts[0] * per_rank[0]["grads"][name] + counts[1] * per_rank[1]["grads"][name]) / sum(counts)
                for name in mean}
    assert_tensors_close(single["joined"]["grads"], weighted, 1e-5)
    joined_loss = (counts[0] * per_rank[0]["loss"] + counts[1] * per_rank[1]["loss"]) / sum(counts)
    assert_close_scaled(single["joined"]["loss"], joined_loss, 1e-5, msg="joined loss")


@pytest.mark.parametrize("recipe", ["mntp", "contrastive"])
def test_gradient_clipping_under_ddp_clips_what_the_reference_clipped(tiny_llama, monkeypatch, recipe):
    """2 ranks (emulated world size), trainer.gradient_clip_val 1.0, a gradient of norm 1.5 on every rank. MNTP's
    gradient is the DDP mean of the per-rank gradients, what run_mntp.py's Trainer clipped at max_grad_norm: clipped
    to 1.0. The contrastive recipes' gradient is the world size times that mean (training_step scales the loss), so
    the threshold scales with it: 1.5 = 2 x 0.75 is not clipped, as the reference's 0.75 was not. Before: MNTP's
    threshold was scaled by the world size too (2.0), so its 1.5 was not clipped."""
    import pytorch_lightning as pl

    from promptemb.lightning_modules import base

    monkeypatch.setattr(base, "world_size", lambda: 2)
    cls = LLM2VecMNTP if recipe == "mntp" else LLM2VecContrastive
    module = cls(str(tiny_llama), lora_r=2, lora_alpha=4)
    module.trainer = pl.Trainer(accelerator="cpu", gradient_clip_val=1.0, logger=False, enable_checkpointing=False)
    params = [p for p in module.parameters() if p.requires_grad]
    torch.manual_seed(0)
    for parameter in params:
        parameter.grad = torch.randn_like(parameter)
    scale = 1.5 / torch.cat([p.grad.flatten() for p in params]).norm()
    for parameter in params:
        parameter.grad *= scale
    module.configure_gradient_clipping(torch.optim.AdamW(params), 1.0, "norm")
    norm = float(torch.cat([p.grad.flatten() for p in params]).norm())
    # float32 norms of the same float32 gradients: round-off
    assert norm == pytest.approx(1.0 if recipe == "mntp" else 1.5, rel=1e-5)
