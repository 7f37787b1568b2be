"""Matryoshka training: the loss and its gradients equal sentence-transformers' MatryoshkaLoss around
MultipleNegativesRankingLoss (scale = 1/τ), on a tiny SentenceTransformer and through every recipe's own step;
bad widths are refused in one line before any model loads."""

from __future__ import annotations

import re
import warnings

import pytest
import torch
from sentence_transformers import SentenceTransformer
from sentence_transformers.sentence_transformer.losses import MatryoshkaLoss, MultipleNegativesRankingLoss
from sentence_transformers.sentence_transformer.modules import Pooling, Transformer

from promptemb.common.errors import ConfigError
from promptemb.lightning_modules.losses import info_nce
from promptemb.lightning_modules.matryoshka import Matryoshka, check_matryoshka_settings
from promptemb.lightning_modules.promptbert import PromptBERTSup, PromptBERTUnsup
from promptemb.training.command_line import checked as check_train_config
from tests.helpers import assert_tensors_close
from tests.lightning_modules.test_grad_cache import (
    FP32_LOGITS_TOL,
    SENTENCES,
    TRIPLETS,
    assert_same,
    assert_same_loss,
    loss_and_grads,
    make,
)
from tests.training.test_train import compose_train

TAU = 0.05


class GivenEmbeddings(torch.nn.Module):
    """A SentenceTransformer stand-in whose forward returns the embeddings it is handed: MatryoshkaLoss then
    truncates and scores exactly the views our recipe produced (same forward, same graph)."""

    def __init__(self, width: int):
        super().__init__()
        self.width = width

    def get_embedding_dimension(self) -> int:
        return self.width

    _get_untruncated_embedding_dimension = get_embedding_dimension  # what MatryoshkaLoss reads from 6.3 on

    def forward(self, features: dict) -> dict:
        return {"sentence_embedding": features["embedding"]}


def reference_loss(columns: list[torch.Tensor], dims, weights) -> torch.Tensor:
    """sentence-transformers' MatryoshkaLoss(MultipleNegativesRankingLoss(scale=1/τ)) on the given columns."""
    model = GivenEmbeddings(columns[0].shape[-1])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loss = MatryoshkaLoss(model, MultipleNegativesRankingLoss(model, scale=1 / TAU), dims, weights)
    return loss([{"embedding": column} for column in columns], None)


def tiny_sentence_transformer(path) -> SentenceTransformer:
    torch.manual_seed(0)
    return SentenceTransformer(modules=[Transformer(str(path)), Pooling(32, "mean")], device="cpu").double()


@pytest.mark.parametrize("with_negatives", [False, True])
def test_loss_and_gradients_equal_matryoshka_mnrl_on_a_tiny_model(tiny_bert, with_negatives):
    """A tiny SentenceTransformer (random BERT + mean pooling): ST's loss of its own forward vs ours on the same
    model's embeddings; unsorted widths with weights (ST sorts them widest first, as we do)."""
    dims, weights = [8, 32, 16], [0.5, 1.0, 2.0]
    model = tiny_sentence_transformer(tiny_bert)
    columns = [list(column) for column in zip(*TRIPLETS, strict=True)][: 3 if with_negatives else 2]
    features = [model.tokenize(texts) for texts in columns]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = MatryoshkaLoss(model, MultipleNegativesRankingLoss(model, scale=1 / TAU), dims, weights)(features,
                                                                                                         None)
    their_grads = torch.autograd.grad(theirs, list(model.parameters()), allow_unused=True)
    embeddings = [model(dict(f))["sentence_embedding"] for f in features]
    ours = Matryoshka.build(dims, weights).loss(embeddings[0], embeddings[1], embeddings[2] if with_negatives else
                                                None, TAU)
    our_grads = torch.autograd.grad(ours, list(model.parameters()), allow_unused=True)
    # InfoNCE runs in fp32 (losses.py) on this float64 model, MNRL in float64: agreement to fp32 round-off of the
    # logits' scale 1/τ (the loss) and of each gradient's largest entry
    assert_same_loss(ours.detach(), theirs.detach(), FP32_LOGITS_TOL)
    names = [n for n, _ in model.named_parameters()]
    assert [g is None for g in our_grads] == [g is None for g in their_grads]
    mine = {name: g for name, g in zip(names, our_grads, strict=True) if g is not None}
    reference = {name: g for name, g in zip(names, their_grads, strict=True) if g is not None}
    assert len(reference) > 10
    assert_tensors_close(mine, reference, FP32_LOGITS_TOL)


def views_of(module, batch):
    torch.manual_seed(1)
    return module.contrastive_views(batch)


@pytest.mark.parametrize(("kind", "batch", "dims", "weights"), [
    ("sup", TRIPLETS, [32, 16, 4], None),  # hard negatives, MLM-transform head: truncated after the head
    ("sup", TRIPLETS, [16, 8], [2.0, 0.5]),  # without the full width
    ("opti", SENTENCES, [32, 8], [1.0, 3.0]),
])
def test_recipe_step_equals_matryoshka_mnrl_on_its_views(tiny_bert, kind, batch, dims, weights):
    """The loss Lightning back-propagates and every parameter's gradient equal MatryoshkaLoss(MNRL) applied to the
    recipe's own views (the same forward: views computed under the same seed, no dropout)."""
    module = make(kind, tiny_bert, matryoshka_dims=dims, matryoshka_weights=weights)
    got = loss_and_grads(module, batch)
    module.zero_grad(set_to_none=True)
    columns = [v for v in views_of(module, batch) if v is not None]
    reference = reference_loss(columns, dims, weights)
    reference.backward()
    grads = {name: p.grad.clone() for name, p in module.named_parameters() if p.requires_grad}
    assert_same(got, (reference.detach().to(got[0].dtype), grads), FP32_LOGITS_TOL)  # MNRL runs in float64
    plain = loss_and_grads(make(kind, tiny_bert), batch)
    assert abs(got[0] - plain[0]) > 1e-3  # the widths changed the objective


def test_unsupervised_narrow_terms_truncate_the_evaluated_representation(tiny_bert):
    """PromptBERT unsup: the full-width term is the plain loss on MLP(h); each narrower term truncates h, the
    [MASK] state evaluation reads (the training-only MLP mixes all D inputs, so its prefix is not one of h)."""
    dims, weights = [32, 16, 4], [1.0, 0.5, 0.25]
    module = make("unsup", tiny_bert, matryoshka_dims=dims, matryoshka_weights=weights)
    loss, _ = loss_and_grads(module, SENTENCES)
    torch.manual_seed(1)
    first, second = module.pooled_views(SENTENCES, module.builders, module.train_pooler)
    expected = (1.0 * info_nce(module.mlp(first), module.mlp(second), TAU)
                + 0.5 * info_nce(first[:, :16], second[:, :16], TAU)
                + 0.25 * info_nce(first[:, :4], second[:, :4], TAU))
    # the module's own fp32 InfoNCE calls on the same tensors, in this process, summed in the same order: the same
    # bits on any CPU (1e-9 is below fp32 resolution)
    torch.testing.assert_close(loss, expected.detach(), rtol=1e-9, atol=1e-9)
    plain = make("unsup", tiny_bert, matryoshka_dims=[32])  # the full width alone is the plain recipe
    torch.testing.assert_close(loss_and_grads(plain, SENTENCES)[0], loss_and_grads(make("unsup", tiny_bert),
                                                                                    SENTENCES)[0])


@pytest.mark.parametrize(("kind", "batch"), [("unsup", SENTENCES), ("sup", TRIPLETS)])
def test_grad_cache_gives_the_matryoshka_full_batch_gradient(tiny_bert, kind, batch):
    options = {"matryoshka_dims": [32, 8], "matryoshka_weights": [1.0, 2.0]}
    reference = loss_and_grads(make(kind, tiny_bert, **options), batch)
    assert_same(loss_and_grads(make(kind, tiny_bert, grad_cache_chunk_size=2, **options), batch), reference)


def test_widths_are_sorted_widest_first_with_their_weights():
    assert Matryoshka.build([64, 384, 128], [3, 1, 2]).describe() == {"dims": [384, 128, 64],
                                                                      "weights": [1.0, 2.0, 3.0]}
    assert Matryoshka.build([8]).weights == (1.0,)
    assert Matryoshka.build(None) is None


@pytest.mark.parametrize(("dims", "weights", "message"), [
    ([384, 128], [1.0], "model.matryoshka_weights has 1 value(s) but model.matryoshka_dims has 2: give one weight "
                        "per width, in the same order"),
    ([128, 128], None, "model.matryoshka_dims=[128, 128] lists a width twice"),
    ([], None, "model.matryoshka_dims=[] trains no width"),
    (None, [1.0], "model.matryoshka_weights is set but model.matryoshka_dims is not"),
    ([64], [0.0], "model.matryoshka_weights=[0.0]: every weight must be a number > 0"),
])
def test_inconsistent_settings_are_refused(dims, weights, message):
    with pytest.raises(ConfigError, match=f"^{re.escape(message)}"):
        check_matryoshka_settings(dims, weights)


def test_a_width_beyond_the_representation_is_refused_by_the_constructor(tiny_bert):
    with pytest.raises(ConfigError, match=re.escape("model.matryoshka_dims=[64, 8]: 64 is wider than "
                                                    "PromptBERTSup's 32-dimensional representation")):
        PromptBERTSup(str(tiny_bert), matryoshka_dims=[8, 64])
    with pytest.raises(ConfigError, match="wider than PromptBERTUnsup's 32-dimensional"):
        PromptBERTUnsup(str(tiny_bert), matryoshka_dims=[33])


@pytest.mark.parametrize(("overrides", "message"), [
    (["model.matryoshka_dims=[384,128,64]", "model.matryoshka_weights=[1,1]"],
     "model.matryoshka_weights has 2 value(s) but model.matryoshka_dims has 3"),
    (["model.matryoshka_dims=[768,128]"], "model.matryoshka_dims=[768, 128]: 768 is wider than PromptBERTUnsup's "
                                          "384-dimensional representation; use widths <= 384"),
    (["model.matryoshka_dims=[0]"], "model.matryoshka_dims=[0]: Input should be greater than or equal to 1"),
    (["model.matryoshka_dims=[64]", "model.matryoshka_weights=[-1.0]"], "model.matryoshka_weights=[-1.0]: Input "
                                                                        "should be greater than 0"),
    (["model.matryoshka_dims=64"], "model.matryoshka_dims=64: Input should be a valid list"),
])
def test_train_config_check_refuses_bad_widths_before_loading(overrides, message, real_data_root, tmp_path):
    """train.py's config check (before any model loads): the MiniLM quickstart with widths it cannot train."""
    cfg = compose_train(["experiment=quickstart_unsup", f"data_root={real_data_root}",
                         f"output_dir={tmp_path / 'run'}", *overrides])
    with pytest.raises(ConfigError, match=re.escape(message)):
        check_train_config(cfg)
    assert not (tmp_path / "run").exists()
