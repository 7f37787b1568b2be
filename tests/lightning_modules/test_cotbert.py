"""CoT-BERT against the official code (ZBWpro/CoT-BERT; the arrays of cotbert_official_references.py beside this
file) on tiny random BERT and RoBERTa models: the training inputs of its three templates, the [PAD]-filled denoising
rows, the loss, logits and every gradient of a training step (the whole batch, and the reported runs' two
DataParallel halves), and the evaluation embeddings; gradient caching and a compiled step's shapes; the recipe's
configs and refusals."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer, BertModel, RobertaModel

from promptemb.common.errors import ConfigError
from promptemb.encoder.loading import resolve_model_path
from promptemb.lightning_modules.cotbert import CoTBERT, cotbert_logits, cotbert_loss
from promptemb.training.runner import build_module
from tests.helpers import MINILM, assert_close_scaled, assert_tensors_close, sha256
from tests.lightning_modules import cotbert_official_references as ref
from tests.training.test_train import compose_train

RECORD = json.loads(ref.OUT_JSON.read_text(encoding="utf-8"))
ARRAYS = np.load(ref.OUT_NPZ)
#: float32 forwards of the same tiny model in another transformers release and batch layout: to this fraction of
#: the compared tensor's largest entry (observed at most 1.6e-6: losses, logits, biases, embeddings)
FORWARD_TOL = 1e-5
#: each gradient to this fraction of its largest entry (observed at most 8.6e-6)
GRAD_TOL = 1e-4
EXPERIMENTS = {"bert": "cotbert_unsup", "roberta": "cotbert_unsup_roberta"}


def roberta_tokenizer(folder: Path):
    """The reference's byte-level BPE from its recorded vocabulary and merges."""
    from tokenizers import AddedToken, ByteLevelBPETokenizer
    from transformers import RobertaTokenizerFast

    vocab, merges = RECORD["roberta_tokenizer"]["vocab"], RECORD["roberta_tokenizer"]["merges"]
    (folder / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    (folder / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n", encoding="utf-8")
    bpe = ByteLevelBPETokenizer(str(folder / "vocab.json"), str(folder / "merges.txt"))
    bpe.add_special_tokens([AddedToken("<mask>", lstrip=True, rstrip=False, special=True)])
    tokenizer = RobertaTokenizerFast(tokenizer_object=bpe._tokenizer, bos_token="<s>", eos_token="</s>",
                                     sep_token="</s>", cls_token="<s>", unk_token="<unk>", pad_token="<pad>",
                                     mask_token=AddedToken("<mask>", lstrip=True, rstrip=False))
    tokenizer.model_max_length = 128
    assert len(tokenizer) == len(vocab) and tokenizer.pad_token_id == 1 and tokenizer.mask_token_id == 4
    return tokenizer


@pytest.fixture(scope="module", params=["bert", "roberta"])
def family(request, tmp_path_factory) -> tuple[str, Path]:
    """(family, the reference's tiny model saved by this transformers release): the same weights, drawn by name."""
    name = request.param
    folder = tmp_path_factory.mktemp(f"cotbert_{name}")
    if name == "bert":
        tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(MINILM))
        assert sha256(Path(resolve_model_path(MINILM)) / "vocab.txt") == RECORD["sha256"]["minilm_vocab.txt"]
        model = BertModel(ref.bert_config(len(tokenizer)))
    else:
        tokenizer = roberta_tokenizer(folder)
        model = RobertaModel(ref.roberta_config(len(tokenizer)))
    official = sorted(n.split(".", 1)[1] for n in RECORD["families"][name]["parameter_names"]
                      if not n.startswith("mlp."))
    assert ref.parameter_names(model) == official
    ref.seed_weights(model)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return name, folder


def recipe(name: str, folder: Path, *overrides: str) -> CoTBERT:
    """The recipe's module as its experiment configures it, on the tiny model, its MLP drawn as the reference's."""
    cfg = compose_train([f"experiment={EXPERIMENTS[name]}", f"backbone.name_or_path={folder}", *overrides])
    module = build_module(cfg)
    ref.seed_mlp(module.mlp.dense)
    return module


def test_training_inputs_are_the_officials(family):
    """Each view's ids, sentence truncated to 32 tokens, no "." appended; RoBERTa: the first word without `Ġ`, the
    bare `Ġ` before </s>."""
    name, folder = family
    module = recipe(name, folder)
    official = ARRAYS[f"{name}/input_ids"]  # [B, 3 views, width], padded with [PAD]
    mask = ARRAYS[f"{name}/attention_mask"].astype(bool)
    for view, builder in enumerate(module.builders):
        built = builder.build(ref.TRAIN_SENTENCES)
        assert [item.input_ids for item in built] == [official[i, view][mask[i, view]].tolist()
                                                      for i in range(len(built))]
    assert any(item.truncated for item in module.builders[0].build(ref.TRAIN_SENTENCES))


def test_pad_denoising_rows_are_the_officials(family):
    """The bias of every template and sentence length: the second [MASK] of `[CLS] prefix [PAD]*n suffix [SEP]`,
    [PAD]s attended (RoBERTa: at position padding_idx, the suffix unshifted), as `models.denoising` computes it."""
    name, folder = family
    module = recipe(name, folder).eval()
    lengths = torch.arange(34)
    with torch.no_grad():
        biases = module.compute_template_biases(module.builders, [lengths] * 3)
    layer = module.transformer.config.num_hidden_layers
    for view, kind in enumerate(("pos-1", "pos-2", "neg-1")):
        expected = ARRAYS[f"{name}/denoising/{kind}"][: len(lengths)]
        assert_close_scaled(biases[view][layer], expected, FORWARD_TOL, msg=f"{name} {kind}")


@pytest.mark.parametrize("case, groups", [("whole", 1), ("dataparallel2", 2)])
def test_training_step_is_the_officials(family, case, groups):
    """cl_forward's loss, logits and every gradient (transformer and MLP), in train mode: the whole batch
    (model.loss_groups=1), and the reported runs' two DataParallel replicas, one loss each, averaged (2)."""
    name, folder = family
    module = recipe(name, folder, f"model.loss_groups={groups}").train()
    prefix = f"{name}/{case}"
    anchors, positives, negatives = module.contrastive_views(ref.TRAIN_SENTENCES)
    loss = module.contrastive_objective(anchors, positives, negatives)
    assert_close_scaled(loss, ARRAYS[f"{prefix}/loss"], FORWARD_TOL, msg="loss")
    for index, rows in enumerate(zip(anchors.chunk(groups), positives.chunk(groups), negatives.chunk(groups),
                                     strict=True)):
        logits = cotbert_logits(*rows, module.hparams.temperature)
        assert_close_scaled(logits, ARRAYS[f"{prefix}/logits{index}"], FORWARD_TOL, msg=f"logits {index}")
    loss.backward()
    backbone = "bert." if name == "bert" else "roberta."
    rows = torch.from_numpy(ARRAYS[f"{name}/word_embedding_rows"])
    got, expected = {}, {}
    for key, parameter in module.named_parameters():
        official = key.replace("transformer.", backbone, 1)
        if f"{prefix}/grad/{official}" not in ARRAYS:
            assert parameter.grad is None or not parameter.grad.any(), key  # the unused [CLS] pooler
            continue
        grad = parameter.grad
        got[official] = grad[rows] if official.endswith("word_embeddings.weight") else grad
        expected[official] = torch.from_numpy(ARRAYS[f"{prefix}/grad/{official}"])
    assert len(got) == len([k for k in ARRAYS.files if k.startswith(f"{prefix}/grad/")])
    assert_tensors_close(got, expected, GRAD_TOL)


def test_evaluation_embeddings_are_the_officials(family):
    """evaluation.py: the first template filled as text ("." appended, nothing truncated), the second [MASK], no
    denoising, no MLP: the module's own evaluation encoder and [MASK] pooler, with the inputs it fed the model."""
    name, folder = family
    module = recipe(name, folder).eval()
    pooler = module.eval_poolers()[0]
    encoder = module.evaluation_encoder()
    builder = encoder.input_builder(encoder_form(module))
    fed = [ids for batch in RECORD["families"][name]["eval_input_ids"] for ids in batch]
    pad = module.tokenizer.pad_token_id
    assert [item.input_ids for item in builder.build(ref.EVAL_SENTENCES)] == [
        ids[: len(ids) - next((k for k, t in enumerate(reversed(ids)) if t != pad), 0)] for ids in fed]
    got = encoder.embed(ref.EVAL_SENTENCES, [pooler], module.eval_template, module.hparams.sentence_rule)[pooler.name]
    assert_close_scaled(got, ARRAYS[f"{name}/eval/embeddings"], FORWARD_TOL)


def encoder_form(module):
    from promptemb.encoder.inputs import InputForm

    return InputForm(module.eval_template, module.hparams.sentence_rule, None)


def test_the_loss_is_the_formula():
    """ℓ_i = −log e^{s(h_i,h⁺_i)} / Σ_j [e^{s(h_i,h⁺_j)} + e^{s(h_i,h⁻_j)} + e^{s(h⁺_i,h⁻_j)}], s = cos/τ, summed
    in float64 over explicit loops; two groups: the mean of the two halves' losses."""
    generator = torch.Generator().manual_seed(0)
    a, p, n = (torch.randn(6, 5, generator=generator, dtype=torch.float64) for _ in range(3))

    def cos(x, y):
        return float(x @ y / (x.norm() * y.norm())) / 0.05

    def reference(a, p, n):
        total = 0.0
        for i in range(len(a)):
            denominator = sum(np.exp(cos(a[i], p[j])) + np.exp(cos(a[i], n[j])) + np.exp(cos(p[i], n[j]))
                              for j in range(len(a)))
            total -= np.log(np.exp(cos(a[i], p[i])) / denominator)
        return total / len(a)

    assert_close_scaled(cotbert_loss(a, p, n), reference(a, p, n), 1e-6)
    halves = (reference(a[:3], p[:3], n[:3]) + reference(a[3:], p[3:], n[3:])) / 2
    assert_close_scaled(cotbert_loss(a, p, n, groups=2), halves, 1e-6)


def test_recipes_use_the_official_templates():
    bert, roberta = (compose_train([f"experiment={name}"]).model for name in EXPERIMENTS.values())
    assert bert.model_name_or_path == "bert-base-uncased" and roberta.model_name_or_path == "roberta-base"
    texts = {name: RECORD["families"][name]["model_args"] for name in EXPERIMENTS}
    for model, args in ((bert, texts["bert"]), (roberta, texts["roberta"])):
        assert args["mask_num"] == 2 and args["temp"] == model.temperature == 0.05
        assert args["mask_embedding_sentence_delta"] and args["mask_embedding_sentence_delta_no_delta_eval"]
        assert args["mlp_only_train"] and not args["mask_embedding_sentence_org_mlp"]
        assert model.denoise and model.freeze_bias is args["mask_embedding_sentence_delta_freeze"] is False
        assert (model.sentence_rule, model.train_sentence_rule, model.max_sentence_tokens) == ("promptbert", "none", 32)
        assert model.loss_groups == 2
    assert list(roberta.templates) == ["The sentence of '[X] ' means [MASK] , so it can be summarized as [MASK] . ",
                                       "The sentence : '[X] ' means [MASK] , so it can be summarized as [MASK] . "]
    assert roberta.eval_template == "The sentence of ' [X] ' means [MASK] , so it can be summarized as [MASK] ."


@pytest.mark.parametrize("settings, message", [
    ({"templates": ['This sentence : "[X]" means [MASK] .', 'The sentence : "[X]" means [MASK] , so [MASK] .']},
     r"CoTBERT needs exactly 2 \[MASK\]s in each template .*'This sentence : \"\[X\]\" means \[MASK\] \.' has 1"),
    ({"negative_template": 'The sentence : "[X]" does not mean [MASK] , [MASK] , [MASK] .'}, r"has 3"),
    ({"matryoshka_dims": [16]}, r"drop model.matryoshka_dims"),
])
def test_refused_settings(settings, message):
    with pytest.raises(ConfigError, match=message):
        CoTBERT.check_config(settings)


@pytest.mark.parametrize("options", [{"grad_cache_chunk_size": 3}, {"grad_cache_chunk_size": 3, "freeze_bias": True},
                                     {"length_buckets": (8, 16, 32)}])
def test_grad_cache_and_compiled_shapes_give_the_plain_step(tiny_bert, options):
    """Gradient caching (the [PAD]-filled biases from the step's bias cache) and a compiled step's fixed shapes
    (every length's bias row, views padded to a bucket) give the plain step's loss and gradients (float64 modules,
    two loss groups)."""
    from tests.lightning_modules.test_grad_cache import SENTENCES, assert_same, loss_and_grads

    def make(**kwargs):
        buckets = kwargs.pop("length_buckets", None)
        torch.manual_seed(0)
        module = CoTBERT(str(tiny_bert), loss_groups=2, **kwargs).double().train()
        module.length_buckets = buckets
        return module

    plain = {key: value for key, value in options.items() if key == "freeze_bias"}
    assert_same(loss_and_grads(make(**options), SENTENCES), loss_and_grads(make(**plain), SENTENCES))


def test_template_without_two_masks_is_refused_by_train_py(tmp_path):
    """Before any weights load (the backbone does not exist): one line, exit 2, no run folder."""
    from tests.helpers import assert_one_line_error
    from tests.training.test_train import run_train

    out = tmp_path / "run"
    proc = run_train("experiment=cotbert_unsup", "template=promptbert_bert_pair", f"output_dir={out}",
                     f"backbone.name_or_path={tmp_path / 'no_such_model'}")
    assert_one_line_error(proc, r"^error: CoTBERT needs exactly 2 \[MASK\]s in each template \(the first "
                                r"comprehends, the second is pooled\); 'This sentence of \"\[X\]\" means \[MASK\] \.' "
                                r"has 1", out)


@pytest.mark.parametrize("which, expected", [(None, [[1.5, 3.5], [5.0, 6.0]]), (0, [[1.0, 3.0], [5.0, 6.0]]),
                                             (-1, [[2.0, 4.0], [5.0, 6.0]]), (1, [[2.0, 4.0], [0.0, 0.0]])])
def test_which_mask_pools_one_mask_of_each_row(which, expected):
    """`which_mask`: the k-th [MASK] of each row (negative: from its last), or the mean of all (None); a row
    without a k-th [MASK] pools nothing (the templates are checked to have two)."""
    from promptemb.encoder.outputs import EncoderOutput
    from promptemb.poolers.mask import MaskPooler

    states = torch.tensor([[[9.0, 9.0], [1.0, 3.0], [7.0, 7.0], [2.0, 4.0]],
                           [[9.0, 9.0], [8.0, 8.0], [5.0, 6.0], [0.0, 0.0]]])
    mask = torch.tensor([[False, True, False, True], [False, False, True, False]])
    out = EncoderOutput(num_layers=1, input_ids=torch.zeros(2, 4, dtype=torch.long), attention_mask=torch.ones(2, 4),
                        roles=torch.zeros(2, 4, dtype=torch.long), mask_token=mask, hidden_states={1: states})
    pooler = MaskPooler("mask", which_mask=which)
    assert torch.equal(pooler(out), torch.tensor(expected))
    assert pooler.describe().get("which_mask") == which


def test_a_checkpoint_rebuilds_and_encodes_its_second_mask_everywhere(tiny_bert, tmp_path):
    """A checkpoint of the registered recipe rebuilds from its recorded constructor arguments (the base class's
    `load_checkpoint`), and every inference path encodes as evaluation scores it, the second [MASK] undenoised (not
    the mean of the two): `load_encoder` on the checkpoint, its export read back, and the export's
    sentence-transformers module; the export records which [MASK]; denoise= is refused before anything loads."""
    from promptemb.exporting.runner import export_checkpoint
    from promptemb.inference import load_encoder
    from promptemb.lightning_modules.checkpoint import load_module_checkpoint
    from promptemb.poolers.mask import MaskPooler
    from tests.exporting.test_export import (
        SENTENCES,
        assert_same_embeddings,
        framework_embeddings,
        sentence_transformer,
    )

    torch.manual_seed(0)
    module = CoTBERT(str(tiny_bert), loss_groups=2, sentence_rule="promptbert")
    checkpoint = {"state_dict": module.state_dict(), "hyper_parameters": dict(module.hparams), "global_step": 0}
    module.on_save_checkpoint(checkpoint)
    assert checkpoint["promptemb_recipe"]["name"] == "cotbert_unsup"
    torch.save(checkpoint, ckpt := tmp_path / "cotbert.ckpt")
    loaded = load_module_checkpoint(ckpt).module
    assert type(loaded) is CoTBERT and loaded.hparams.loss_groups == 2
    reference = framework_embeddings(loaded, SENTENCES)
    both = loaded.evaluation_encoder(batch_size=3).embed(SENTENCES, [MaskPooler("mask")], loaded.eval_template,
                                                         "promptbert")["mask"]
    assert not np.allclose(reference, both, atol=1e-3)  # which [MASK] is pooled shows in the embeddings
    out = export_checkpoint(ckpt, tmp_path / "export")
    assert json.loads((out / "config.json").read_text())["promptemb"]["pooler"]["which_mask"] == -1
    assert "[MASK] number -1" in (out / "README.md").read_text()
    for got in (load_encoder(ckpt).encode(SENTENCES), load_encoder(out).encode(SENTENCES),
                sentence_transformer(out).encode(SENTENCES, batch_size=4, convert_to_numpy=True)):
        assert_same_embeddings(got, reference)
    with pytest.raises(ConfigError, match=r"is a CoTBERT checkpoint: it denoises in training only .*drop denoise=$"):
        export_checkpoint(ckpt, tmp_path / "denoised", denoise=True)
    assert not (tmp_path / "denoised").exists()
