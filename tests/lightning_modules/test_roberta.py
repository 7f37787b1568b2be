"""RoBERTa end to end, on a tiny random RobertaForMaskedLM with a real byte-level BPE tokenizer (tests/helpers.py):
remove-biases keeps word-initial `Ġ` tokens, the three RoBERTa recipes denoise with positions counted from
padding_idx + 1, the supervised head starts from `lm_head`, and checkpoints export and reload exactly."""

from __future__ import annotations

import numpy as np
import pytest
import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader
from transformers import AutoTokenizer

from promptemb.encoder.forward import position_base
from promptemb.encoder.model import Encoder
from promptemb.exporting.runner import export_checkpoint
from promptemb.inference import load_encoder
from promptemb.lightning_modules.checkpoint import load_module_checkpoint
from promptemb.poolers.remove_biases import RemoveBiasesPooler
from promptemb.training.runner import build_module
from tests.encoder.test_denoising import direct_bias
from tests.exporting.test_export import SENTENCES, assert_same_embeddings, framework_embeddings, sentence_transformer
from tests.helpers import assert_close_scaled
from tests.lightning_modules.test_grad_cache import TRIPLETS
from tests.training.test_train import compose_train

#: Float32 forwards of one model in two batch shapes (the CPU's kernels order their sums): to FORWARD_TOL of the
#: compared vector's largest entry (observed at most 5.7e-8).
FORWARD_TOL = 1e-5
RECIPES = ["promptbert_unsup_roberta", "promptbert_sup_roberta", "optiprompt_roberta"]


def recipe_module(name: str, model_dir, *overrides):
    cfg = compose_train([f"experiment={name}", f"backbone.name_or_path={model_dir}", *overrides])
    torch.manual_seed(0)
    return build_module(cfg)


def test_recipes_use_the_papers_roberta_templates(tiny_roberta):
    unsup, sup, opti = (compose_train([f"experiment={name}"]).model for name in RECIPES)
    assert unsup.model_name_or_path == sup.model_name_or_path == opti.model_name_or_path == "roberta-base"
    assert list(unsup.templates) == ["This sentence : '[X] ' means[MASK].", "The sentence : '[X] ' means[MASK]."]
    assert list(sup.templates) == ["This sentence : '[X] ' means[MASK]."]
    assert opti.template == "This sentence : '[X] ' means[MASK]."
    assert unsup.eval_template == sup.eval_template == opti.eval_template == "This sentence : ' [X] ' means[MASK]."


def test_remove_biases_keeps_word_initial_byte_level_tokens(tiny_roberta):
    tokenizer = AutoTokenizer.from_pretrained(tiny_roberta)
    pooler = RemoveBiasesPooler()
    pooler.bind_tokenizer(tokenizer)
    sentence = "A child reads in the café in Zürich, Mr. Smith said."
    ids = tokenizer(sentence)["input_ids"]
    tokens = tokenizer.convert_ids_to_tokens(ids)
    kept = [token for token, i in zip(tokens, ids, strict=True) if pooler.keep_vocab[i]]
    # word starts (`Ġ` = a byte-level space) and accented words stay; the frequent list, punctuation, cased words
    # and sentence-initial capitals go, as with BERT
    assert kept == ["Ġchild", "Ġreads", "ĠcafÃ©"]
    assert {"A", "Ġin", "Ġthe", ",", "ĠMr", ".", "ĠSmith", "Ġsaid"} <= set(tokens)
    space = tokenizer.convert_tokens_to_ids("Ġ")
    assert not pooler.keep_vocab[space]  # a bare space is no word

    encoder = Encoder(str(tiny_roberta), device="cpu", progress=False)
    got = encoder.embed([sentence], [pooler])[pooler.name][0]
    table = encoder.transformer.get_input_embeddings().weight.detach().numpy()
    expected = np.mean([table[i] for i in ids if pooler.keep_vocab[i]], axis=0)
    assert_close_scaled(got, expected, FORWARD_TOL)  # a mean of float32 rows, summed in the kernel's order


@pytest.mark.parametrize("name", RECIPES)
def test_denoising_counts_positions_from_padding_idx_plus_one(tiny_roberta, name):
    """The bias of every template the recipe denoises with equals a direct forward of the template alone whose
    position ids start at 2 and skip the n sentence tokens; starting at 0 would give another bias."""
    module = recipe_module(name, tiny_roberta, "model.denoise=true").eval()
    model, tokenizer = module.transformer, module.tokenizer
    assert position_base(model) == 2
    lengths = torch.tensor([1, 4, 9, 4])
    for builder in module.builders:
        with torch.no_grad():
            got = module.compute_template_biases([builder], [lengths])[0][model.config.num_hidden_layers]
        for row, n in enumerate(lengths.tolist()):
            assert_close_scaled(got[row], direct_bias(model, tokenizer, builder, n, base=2), FORWARD_TOL)
        assert (got[0] - direct_bias(model, tokenizer, builder, 1, base=0)).abs().max() > 1e-3


def test_denoised_embedding_is_the_reference_head_of_the_sentence_mask_state_minus_the_aligned_bias(tiny_roberta):
    """Supervised recipe, end to end, as the reference's RoBERTa recipe computes it in training and evaluation:
    tanh(W(h_mask(sentence, RoBERTa's own positions) − h_mask(template alone at the positions it has next to the
    sentence))) + b)."""
    # float64: the head sees h - bias, far smaller than h, while float32 round-off is of |h| (here ~5e-6 of the
    # embedding's largest entry, which a tolerance scaled to the embedding would not know)
    module = recipe_module("promptbert_sup_roberta", tiny_roberta).double().eval()
    model, tokenizer, builder = module.transformer, module.tokenizer, module.builders[0]
    sentence = "two dogs run in a field"
    item = builder.build([sentence])[0]
    with torch.no_grad():
        got = module.pooled([sentence], builder, module.pooler)[0]
        hidden = model(torch.tensor([item.input_ids])).last_hidden_state[0]  # positions 2, 3, ... from the model
        mask = hidden[[t for t, i in enumerate(item.input_ids) if i == tokenizer.mask_token_id]].mean(0)
        bias = direct_bias(model, tokenizer, builder, item.sentence_length, 2)
        expected = torch.tanh(module.head.dense.weight @ (mask - bias) + module.head.dense.bias)
    assert_close_scaled(got, expected, 1e-9)  # float64 round-off, with room for the cancellation
    assert module.eval_poolers()[0] is module.pooler  # the head is applied in evaluation too


def test_supervised_roberta_head_is_the_reference_randomly_initialised_tanh_layer(tiny_roberta):
    """The reference's RoBERTa head is a fresh dense + tanh (weights ~ N(0, initializer_range), bias 0), not the
    checkpoint's lm_head."""
    module = recipe_module("promptbert_sup_roberta", tiny_roberta)
    assert isinstance(module.head.activation, torch.nn.Tanh) and not module.head_initialised_from_checkpoint
    assert not hasattr(module.head, "layer_norm")
    assert module.head.dense.bias.abs().max() == 0
    std = module.transformer.config.initializer_range
    assert abs(module.head.dense.weight.std().item() - std) < 0.2 * std


@pytest.mark.parametrize("name", RECIPES)
def test_export_round_trip(tiny_roberta, tmp_path, name):
    """One optimiser step on the recipe, its checkpoint exported: sentence-transformers, the export directory and the
    checkpoint itself all give the framework's evaluation embeddings."""
    module = recipe_module(name, tiny_roberta, "optimizer.lr=1e-3")
    batch = TRIPLETS if "sup" in name.split("_") else [s for s in SENTENCES if len(s) < 100]
    trainer = pl.Trainer(accelerator="cpu", max_steps=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path)
    trainer.fit(module, DataLoader([batch], batch_size=None, collate_fn=lambda b: b))
    ckpt = tmp_path / "step1.ckpt"
    trainer.save_checkpoint(ckpt)
    reference = framework_embeddings(load_module_checkpoint(ckpt).module, SENTENCES)
    out = export_checkpoint(ckpt, tmp_path / "export")
    for got in (sentence_transformer(out).encode(SENTENCES, batch_size=3, convert_to_numpy=True),
                load_encoder(out).encode(SENTENCES), load_encoder(ckpt).encode(SENTENCES)):
        assert_same_embeddings(got, reference)


# kongds/Prompt-BERT's RoBERTa template (run.sh), `_` standing for a space.
REFERENCE_TEMPLATE = "*cls*_This_sentence_:_'_*sent_0*_'_means*mask*.*sep+*"
REFERENCE_SECOND_TEMPLATE = "*cls*_The_sentence_:_'_*sent_0*_'_means*mask*.*sep+*"
ID_SENTENCES = ["two dogs run in a field .", "A man is playing a guitar in the park.", "the sun is shining ."]


def reference_training_ids(tokenizer, template: str, sentence: str) -> list[int]:
    """The reference's training inputs (train.py, as DESIGN.md §3 describes them): the template is cut at the
    sentence into a start (spaces restored, stripped) and an end (spaces restored); start without its `</s>`, the
    sentence tokenized alone without special tokens, end without its `<s>`."""
    filled = (template.replace("*mask*", tokenizer.mask_token).replace("*sep+*", "").replace("*cls*", "")
              .replace("*sent_0*", " "))
    start, end = filled.split(" ")
    return (tokenizer.encode(start.replace("_", " ").strip())[:-1]
            + tokenizer.encode(sentence, add_special_tokens=False) + tokenizer.encode(end.replace("_", " "))[1:])


def reference_evaluation_ids(tokenizer, template: str, sentence: str) -> list[int]:
    """The reference's evaluation inputs (evaluation.py): spaces restored, the sentence put in place, the whole
    string stripped and tokenized at once."""
    filled = (template.replace("*mask*", tokenizer.mask_token).replace("_", " ").replace("*sep+*", "")
              .replace("*cls*", ""))
    return tokenizer(filled.replace("*sent 0*", sentence).strip())["input_ids"]


@pytest.mark.parametrize("name", RECIPES)
def test_roberta_recipes_give_the_reference_token_ids_in_training_and_evaluation(tiny_roberta, name):
    """Byte-level BPE makes spacing part of the token: the recipes' training inputs are the reference's training ids
    (`Ġ'` after the sentence, `.` without `Ġ` at the end, the sentence's first word without `Ġ`), and their
    evaluation inputs the reference's evaluation ids (the first word with its `Ġ`)."""
    module = recipe_module(name, tiny_roberta)
    tokenizer = module.tokenizer
    references = [REFERENCE_TEMPLATE, REFERENCE_SECOND_TEMPLATE][:len(module.builders)]
    evaluation = module._builder(module.eval_template, None)
    for sentence in ID_SENTENCES:
        for builder, template in zip(module.builders, references, strict=True):
            assert builder.build([sentence])[0].input_ids == reference_training_ids(tokenizer, template, sentence)
        assert evaluation.build([sentence])[0].input_ids == reference_evaluation_ids(tokenizer, REFERENCE_TEMPLATE,
                                                                                     sentence)
    trained = tokenizer.convert_ids_to_tokens(module.builders[0].build(["the sun"])[0].input_ids)
    evaluated = tokenizer.convert_ids_to_tokens(evaluation.build(["the sun"])[0].input_ids)
    assert trained[4] == evaluated[4] == "Ġ'" and trained[-4:] == evaluated[-4:] == ["Ġmeans", "<mask>", ".", "</s>"]
    assert trained[5] == "the" and evaluated[5].startswith("Ġ")  # the first sentence piece: without, with its space


def test_a_space_before_the_sentence_changes_no_wordpiece_ids(tiny_bert):
    """WordPiece ignores spacing: a template written with a space before [X] gives BERT the same ids."""
    from promptemb.encoder.inputs import InputBuilder, InputForm
    from promptemb.encoder.template import Template

    tokenizer = AutoTokenizer.from_pretrained(tiny_bert)
    plain, spaced = (InputBuilder(tokenizer, InputForm(Template(text)), 64).build(ID_SENTENCES)
                     for text in ('This sentence : "[X]" means [MASK] .', 'This sentence : " [X] " means[MASK].'))
    assert [item.input_ids for item in plain] == [item.input_ids for item in spaced]
