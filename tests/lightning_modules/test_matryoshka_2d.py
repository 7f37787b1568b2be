"""Adaptive layers (2D Matryoshka): the loss and its gradients equal sentence-transformers' AdaptiveLayerLoss and
Matryoshka2dLoss around MultipleNegativesRankingLoss (scale = 1/τ), with the same draws, on a tiny SentenceTransformer
and on every recipe's own views; a depth's views are those of the model cut after that layer; bad settings are
refused in one line before any model loads."""

from __future__ import annotations

import random
import re
import warnings

import pytest
import pytorch_lightning as pl
import torch
from sentence_transformers import SentenceTransformer
from sentence_transformers.sentence_transformer.losses import (
    AdaptiveLayerLoss,
    Matryoshka2dLoss,
    MultipleNegativesRankingLoss,
)
from sentence_transformers.sentence_transformer.modules import Pooling, Transformer
from torch.utils.data import DataLoader

from promptemb.common.errors import ConfigError
from promptemb.lightning_modules.losses import info_nce
from promptemb.lightning_modules.matryoshka import (
    AdaptiveLayers,
    LayerPlan,
    Matryoshka,
    layer_rng,
    split_depths,
)
from promptemb.lightning_modules.promptbert import PromptBERTSup
from promptemb.lightning_modules.prompteol import PromptEOLSup
from promptemb.training.command_line import checked as check_train_config
from tests.decoder_helpers import save_tiny_decoder
from tests.helpers import assert_close_scaled, assert_one_line_error, assert_tensors_close, error_starting
from tests.lightning_modules.test_grad_cache import SENTENCES, TRIPLETS, loss_and_grads, make
from tests.training.test_ddp import single_and_two_ranks
from tests.training.test_train import compose_train, run_train

TAU = 0.05
#: The brief's bounds: the loss to 1e-5 (observed ~1e-6: InfoNCE's fp32 logits against MNRL's float64), every
#: gradient to 1e-4 of its largest entry, floored at 1e-4 of the model's (observed ~3e-6; see assert_tensors_close)
LOSS_TOL, GRAD_TOL = 1e-5, 1e-4

#: (AdaptiveLayers settings, Matryoshka widths, weights, hard negatives): ST's defaults, every setting moved, 2D
#: with its defaults, 2D with several layers and widths per step, 2D with every width and no KL term
SETTINGS = [
    ({}, None, None, False),
    ({"n_layers_per_step": -1, "last_layer_weight": 0.5, "prior_layers_weight": 2.0, "kl_div_weight": 0.7,
      "kl_temperature": 0.5, "layer_weighting": "log"}, None, None, True),
    ({}, [32, 16, 8], [1.0, 2.0, 3.0], True),
    ({"n_layers_per_step": 2, "n_dims_per_step": 2, "layer_weighting": "linear"}, [8, 32, 16], None, False),
    ({"n_dims_per_step": -1, "kl_temperature": 0.0}, [32, 4], [0.5, 1.5], True),
]


def st_loss(model, settings: dict, dims, weights):
    """sentence-transformers' AdaptiveLayerLoss (Matryoshka2dLoss with widths) around MNRL(scale = 1/τ)."""
    settings = dict(settings)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        inner = MultipleNegativesRankingLoss(model, scale=1 / TAU)
        if dims is None:
            return AdaptiveLayerLoss(model, inner, **settings)
        settings.setdefault("n_dims_per_step", 1)
        return Matryoshka2dLoss(model, inner, dims, weights, **settings)


def our_loss(adaptive: AdaptiveLayers, plan: LayerPlan, views, matryoshka: Matryoshka | None):
    def objective(depth_views, widths):
        if matryoshka is None:
            return info_nce(depth_views[0], depth_views[1], TAU, depth_views[2])
        return matryoshka.subset(widths).loss(*depth_views, TAU)

    return adaptive.loss(plan, views, objective, lambda view: view)


def assert_same(got_loss, got_grads: dict, want_loss, want_grads: dict) -> None:
    assert_close_scaled(got_loss, want_loss, 0.0, atol=LOSS_TOL, msg="loss")
    assert want_grads
    assert_tensors_close(got_grads, want_grads, GRAD_TOL)


def tiny_sentence_transformer(path, pooling: str = "mean", width: int = 32) -> SentenceTransformer:
    torch.manual_seed(0)
    return SentenceTransformer(modules=[Transformer(str(path)), Pooling(width, pooling)], device="cpu").double()


@pytest.mark.parametrize(("settings", "dims", "weights", "with_negatives"), SETTINGS)
def test_loss_and_gradients_equal_sentence_transformers_on_a_tiny_model(tiny_bert, settings, dims, weights,
                                                                        with_negatives):
    """A tiny SentenceTransformer (random BERT + mean pooling): ST's loss of its own forward, after random.seed(s),
    vs ours on the same model's embeddings pooled at each layer, drawn from random.Random(s); several seeds, so
    several layers and widths."""
    model = tiny_sentence_transformer(tiny_bert)
    params = list(model.parameters())
    names = [name for name, _ in model.named_parameters()]
    columns = [list(column) for column in zip(*TRIPLETS, strict=True)][: 3 if with_negatives else 2]
    adaptive = AdaptiveLayers.build(settings, None if dims is None else len(dims))
    matryoshka = Matryoshka.build(dims, weights)
    plans = set()
    for seed in (0, 2):  # the default settings draw layer 1, then 0
        features = [model.tokenize(texts) for texts in columns]
        random.seed(seed)
        theirs = st_loss(model, settings, dims, weights)(features, None)
        their_grads = torch.autograd.grad(theirs, params, allow_unused=True)
        plan = adaptive.draw(random.Random(seed), 3, None if dims is None else len(dims))
        plans.add(plan)
        model[0].auto_model.config.output_hidden_states = True
        outputs = [model[0](dict(model.tokenize(texts))) for texts in columns]
        model[0].auto_model.config.output_hidden_states = False
        views = [tuple([model[1]({**out, "token_embeddings": out["all_layer_embeddings"][depth]})
                        ["sentence_embedding"] for out in outputs] + [None] * (3 - len(columns)))
                 for depth in plan.depths]
        ours = our_loss(adaptive, plan, views, matryoshka)
        our_grads = torch.autograd.grad(ours, params, allow_unused=True)
        assert [g is None for g in our_grads] == [g is None for g in their_grads]
        assert_same(ours.detach(), {n: g for n, g in zip(names, our_grads, strict=True) if g is not None},
                    theirs.detach(), {n: g for n, g in zip(names, their_grads, strict=True) if g is not None})
    assert len(plans) > 1 or settings.get("n_layers_per_step") == -1  # the seeds drew different layers


def given_layers(features: dict) -> dict:
    """What stands in for a SentenceTransformer's Transformer forward: it hands the views given for every layer to
    the loss as that layer's token embeddings (one token, pooled by [CLS] pooling: the view itself), writing them
    into the features as Transformer does, where AdaptiveLayerLoss reads them back for the earlier layers."""
    layers = features["layers"]
    features.update(token_embeddings=layers[-1][:, None], all_layer_embeddings=[v[:, None] for v in layers])
    return features


def stand_in(path, width: int) -> SentenceTransformer:
    """A SentenceTransformer over the tiny BERT (so AdaptiveLayerLoss finds its Transformer module and config)
    whose Transformer forward is `given_layers`: the losses then score exactly the views a recipe produced."""
    model = tiny_sentence_transformer(path, "cls", width)
    model[0].forward = given_layers
    assert model.get_embedding_dimension() == width
    return model


def st_features(plan: LayerPlan, views) -> list[dict]:
    """Per column, the views at every hidden-state index (those no depth of the plan reads: zeros)."""
    features = []
    for column in zip(*views, strict=True):
        if column[0] is None:
            continue
        layers = [torch.zeros_like(column[0]) for _ in range(plan.num_layers + 1)]
        for depth, view in zip(plan.depths, column, strict=True):
            layers[depth] = view
        features.append({"layers": layers})
    return features


@pytest.mark.parametrize(("kind", "batch", "settings", "options"), [
    ("sup", TRIPLETS, {}, {}),  # hard negatives, denoised [MASK] through the MLM-transform head at every layer
    ("sup", TRIPLETS, {}, {"matryoshka_dims": [32, 16, 8]}),  # Matryoshka2dLoss's defaults
    ("sup", TRIPLETS, {"n_layers_per_step": 2, "n_dims_per_step": -1, "layer_weighting": "log"},
     {"matryoshka_dims": [16, 32], "matryoshka_weights": [2.0, 0.5]}),
    ("opti", SENTENCES, {"n_layers_per_step": -1, "kl_temperature": 1.0, "prior_layers_weight": 0.5}, {}),
    ("unsup", SENTENCES, {"kl_div_weight": 3.0}, {}),  # two templates, denoised, through the MLP at every layer
])
def test_recipe_step_equals_sentence_transformers_on_its_views(tiny_bert, kind, batch, settings, options):
    """The loss Lightning back-propagates and every parameter's gradient equal ST's loss applied to the recipe's
    own views at each layer (the same forward under the same seed, no dropout), ST's draws after random.seed of
    the key the module drew this batch's layers with; several batches, so several draws."""
    random.seed(0)  # the module's sampling seed is drawn from Python's generator as it is built
    module = make(kind, tiny_bert, adaptive_layers=settings, **options)
    model = stand_in(tiny_bert, 32)
    plans = set()
    for _ in range(2):
        got = loss_and_grads(module, batch)
        plan = module.layer_plan
        plans.add(plan)
        module.zero_grad(set_to_none=True)
        torch.manual_seed(1)  # what loss_and_grads seeds: the same views
        views = split_depths(module.training_views(batch), len(plan.depths))
        random.seed(f"{module.layer_seed}:{module.layer_draws - 1}")  # layer_rng's key of that batch
        reference = st_loss(model, settings, options.get("matryoshka_dims"), options.get("matryoshka_weights"))(
            st_features(plan, views), None)
        reference.backward()
        grads = {name: p.grad.clone() for name, p in module.named_parameters() if p.requires_grad}
        assert_same(got[0], got[1], reference.detach(), grads)
    assert len(plans) > 1 or settings.get("n_layers_per_step") == -1
    plain = loss_and_grads(make(kind, tiny_bert, **options), batch)
    assert abs(got[0] - plain[0]) > 1e-3  # the layers changed the objective


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    return save_tiny_decoder(tmp_path_factory.mktemp("llama"), "llama")


def test_a_decoder_recipe_equals_sentence_transformers_on_its_views(tiny_bert, tiny_llama):
    """PromptEOL sup (LoRA on a tiny Llama, the last token's state; intermediate layers are the raw layer outputs,
    as sentence-transformers reads them): the step equals Matryoshka2dLoss on its views."""
    settings, dims = {"n_layers_per_step": 2}, [64, 16]
    random.seed(0)
    torch.manual_seed(0)
    module = PromptEOLSup(str(tiny_llama), adaptive_layers=settings, matryoshka_dims=dims, lora_r=4).double()
    module.train()
    got = step(module, TRIPLETS)
    plan = module.layer_plan
    assert plan.num_layers == 4
    module.zero_grad(set_to_none=True)
    torch.manual_seed(1)
    views = split_depths(module.training_views(TRIPLETS), len(plan.depths))
    random.seed(f"{module.layer_seed}:{module.layer_draws - 1}")
    reference = st_loss(stand_in(tiny_bert, 64), settings, dims, None)(st_features(plan, views), None)
    reference.backward()
    grads = {name: p.grad.clone() for name, p in module.named_parameters() if p.requires_grad}
    assert_same(got[0], got[1], reference.detach(), grads)


def test_unsupervised_2d_truncates_the_evaluated_representation(tiny_bert):
    """PromptBERT unsup with widths: at each depth the full-width term on MLP(h_l), narrower ones on h_l's prefix
    (as the 1D recipe), and the KL term on MLP(h), what the plain loss contrasts."""
    random.seed(0)
    module = make("unsup", tiny_bert, matryoshka_dims=[32, 16], adaptive_layers={"n_dims_per_step": -1})
    loss, _ = loss_and_grads(module, SENTENCES)
    plan = module.layer_plan
    torch.manual_seed(1)
    forward = module.transformer
    expected = 0
    finals = None
    for index, depth in enumerate(plan.depths):
        cut = make("unsup", tiny_bert)
        cut.transformer.encoder.layer = forward.encoder.layer[:depth]
        cut.transformer.config.num_hidden_layers = depth
        first, second = cut.pooled_views(SENTENCES, cut.builders, cut.train_pooler)
        term = info_nce(module.mlp(first), module.mlp(second), TAU) + info_nce(first[:, :16], second[:, :16], TAU)
        rows = torch.cat([module.mlp(first), module.mlp(second)]).float() / 0.3
        if index == 0:
            expected, finals = term, torch.softmax(rows, -1)
        else:
            kl = torch.nn.functional.kl_div(torch.log_softmax(rows, -1), finals, reduction="batchmean")
            expected = expected + term / len(plan.layers) + kl * 0.3
    assert_close_scaled(loss, expected.detach(), 0.0, atol=1e-9)  # the same fp32 terms on the same tensors


@pytest.mark.parametrize("kind", ["sup", "unsup"])
def test_a_depths_views_are_those_of_the_model_cut_after_that_layer(tiny_bert, kind):
    """ST's 'truncate the layer list' semantics: each depth's slice of the views equals the recipe's views on a copy
    of the model whose transformer stops after that layer (template biases, [MASK] states and heads included)."""
    module = make(kind, tiny_bert, adaptive_layers={"n_layers_per_step": -1})
    batch = TRIPLETS if kind == "sup" else SENTENCES
    module.layer_plan = module.draw_layers()
    assert module.layer_plan.depths == (3, 0, 1, 2)
    views = split_depths(module.training_views(batch), 4)
    for depth, depth_views in zip(module.layer_plan.depths, views, strict=True):
        cut = make(kind, tiny_bert)
        cut.transformer.encoder.layer = cut.transformer.encoder.layer[:depth]
        cut.transformer.config.num_hidden_layers = depth
        for ours, theirs in zip(depth_views, cut.contrastive_views(batch), strict=True):
            if theirs is None:
                assert ours is None
                continue
            torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-12)  # float64, the same kernels


def test_the_forward_runs_once_per_pooled_call(tiny_bert):
    """The earlier depths re-pool the last layer's forward (one transformer call per pooled call, as without
    adaptive layers: OptiPrompt pools twice, two dropout draws)."""
    module = make("opti", tiny_bert, adaptive_layers={"n_layers_per_step": -1})
    calls = []
    module.transformer.register_forward_hook(lambda *args: calls.append(1))
    loss_and_grads(module, SENTENCES)
    assert len(calls) == 2


def step(module, batch):
    """loss_and_grads without its check that every parameter gets gradient: with a narrow width drawn for the last
    layer, its output LayerNorm's bias cancels in the denoised h - bias (zero in exact arithmetic)."""
    module.zero_grad(set_to_none=True)
    torch.manual_seed(1)
    loss, _, to_backward = module.contrastive_loss(batch)
    to_backward(loss).backward()
    return loss.detach(), {name: p.grad.clone() for name, p in module.named_parameters() if p.requires_grad}


@pytest.mark.parametrize(("kind", "batch"), [("unsup", SENTENCES), ("sup", TRIPLETS)])
def test_grad_cache_gives_the_2d_full_batch_gradient(tiny_bert, kind, batch):
    # not layer 0, where PromptBERT's denoised [MASK] state is exactly zero (the template bias is the very same
    # embedding-layer state) and gives the MLP no gradient, which loss_and_grads asserts every parameter gets
    options = {"matryoshka_dims": [32, 8], "adaptive_layers": {"prior_layers": [1, 2]}}
    random.seed(0)
    reference = make(kind, tiny_bert, **options)
    random.seed(0)
    cached = make(kind, tiny_bert, grad_cache_chunk_size=2, **options)
    want, got = step(reference, batch), step(cached, batch)
    assert cached.layer_plan == reference.layer_plan
    assert_close_scaled(got[0], want[0], 0.0, atol=1e-9, msg="loss")
    assert_tensors_close(got[1], want[1], 1e-9)


def test_two_ranks_equal_one_process_on_the_joined_batch(tmp_path):
    """Cross-rank rows: every depth's InfoNCE and the KL term over 2 gloo ranks give the loss and gradient of one
    process on the joined batch (the KL term's rows gathered as InfoNCE's)."""
    single, ranks = single_and_two_ranks("adaptive_layers_ddp_worker.py", str(tmp_path / "result"))
    for ddp in ranks:
        # float64 but for the fp32 logits and softmax, computed from the same gathered rows: float64 round-off
        torch.testing.assert_close(ddp["loss"], single["loss"], rtol=1e-7, atol=1e-7)
        torch.testing.assert_close(ddp["grad"], single["grad"], rtol=1e-6, atol=1e-7)


class PlanRecorder(pl.Callback):
    def __init__(self):
        self.plans = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.plans.append(pl_module.layer_plan)


def test_draws_are_keyed_by_the_runs_seed_and_the_batch_index(tiny_bert):
    """Under a trainer: batch i draws from layer_rng(the module's seed, i), the seed drawn from Python's generator
    as the module is built (so by the run's seed: the same in every rank and again on resume)."""
    random.seed(5)
    module = make("opti", tiny_bert, adaptive_layers={"n_layers_per_step": 1, "prior_layers": [1, 2]})
    random.seed(5)
    assert module.layer_seed == random.getrandbits(64)
    recorder = PlanRecorder()
    trainer = pl.Trainer(accelerator="cpu", max_steps=4, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, callbacks=[recorder])
    trainer.fit(module, DataLoader([SENTENCES[:4]] * 3, batch_size=None))
    adaptive = module.adaptive_layers
    assert recorder.plans == [adaptive.draw(layer_rng(module.layer_seed, i), 3, None) for i in range(4)]
    assert {plan.layers for plan in recorder.plans} == {(1,), (2,)}  # only the listed layers, both drawn


@pytest.mark.parametrize(("settings", "widths", "message"), [
    ({"n_layers_per_step": 0}, None, "model.adaptive_layers.n_layers_per_step=0: draw a count >= 1 per step, or "
                                     "-1 for all"),
    ({"n_dims_per_step": 1}, None, "model.adaptive_layers.n_dims_per_step=1 draws Matryoshka widths, and "
                                   "model.matryoshka_dims is not set"),
    ({"n_dims_per_step": 3}, 2, "model.adaptive_layers.n_dims_per_step=3: model.matryoshka_dims lists 2 width(s); "
                                "draw at most 2, or -1 for all"),
    ({"prior_layers": [1, 1]}, None, "model.adaptive_layers.prior_layers=[1, 1] lists a layer twice"),
    ({"prior_layers": []}, None, "model.adaptive_layers.prior_layers=[] draws no layer"),
    ({"kl_temperature": -0.3}, None, "model.adaptive_layers.kl_temperature=-0.3: Input should be greater than or "
                                     "equal to 0"),
    ({"layer_weighting": "square"}, None, "model.adaptive_layers.layer_weighting='square': Input should be "
                                          "'uniform', 'log' or 'linear'"),
    ({"n_layer_per_step": 1}, None, "model.adaptive_layers.n_layer_per_step is not a key of model.adaptive_layers "
                                    "(AdaptiveLayerLoss's settings); did you mean "
                                    "model.adaptive_layers.n_layers_per_step?"),
    ([1], None, "model.adaptive_layers=[1]: give a map of AdaptiveLayerLoss settings"),
])
def test_inconsistent_settings_are_refused(settings, widths, message):
    with pytest.raises(ConfigError, match=f"^{re.escape(message)}"):
        AdaptiveLayers.build(settings, widths)


def test_layers_beyond_the_model_are_refused_by_the_constructor(tiny_bert):
    with pytest.raises(ConfigError, match=re.escape("model.adaptive_layers.prior_layers=[1, 3]: PromptBERTSup's "
                                                    "model has 3 layers, so a prior layer is one of 0 (the embedding "
                                                    "output) .. 2; layer 3 is not")):
        PromptBERTSup(str(tiny_bert), adaptive_layers={"prior_layers": [1, 3]})


@pytest.mark.parametrize(("overrides", "message"), [
    (["+model.adaptive_layers.prior_layers=[2,6]"], "model.adaptive_layers.prior_layers=[2, 6]: PromptBERTUnsup's "
                                                    "model has 6 layers, so a prior layer is one of 0 (the embedding "
                                                    "output) .. 5; layer 6 is not"),
    (["+model.adaptive_layers.n_layers_per_step=7"], "model.adaptive_layers.n_layers_per_step=7: PromptBERTUnsup's "
                                                     "model has 6 prior layer(s) to draw from; draw at most 6, or -1 "
                                                     "for all"),
    (["+model.adaptive_layers.prior_layers=[1,2]", "+model.adaptive_layers.n_layers_per_step=3"],
     "model.adaptive_layers.n_layers_per_step=3: PromptBERTUnsup's model has 2 prior layer(s) to draw from"),
    (["model.matryoshka_dims=[384,64]", "+model.adaptive_layers.n_dims_per_step=3"],
     "model.adaptive_layers.n_dims_per_step=3: model.matryoshka_dims lists 2 width(s)"),
    (["model.adaptive_layers=2"], "model.adaptive_layers=2: Input should be a valid dictionary"),
])
def test_train_config_check_refuses_bad_layers_before_loading(overrides, message, real_data_root, tmp_path):
    """train.py's config check (before any model loads; MiniLM's depth read from its config.json)."""
    cfg = compose_train(["experiment=quickstart_unsup", f"data_root={real_data_root}",
                         f"output_dir={tmp_path / 'run'}", *overrides])
    with pytest.raises(ConfigError, match=re.escape(message)):
        check_train_config(cfg)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("recipe", ["quickstart_dcpcse_unsup", "quickstart_angle"])
def test_recipes_without_adaptive_layers_refuse_them(recipe, real_data_root, tmp_path):
    cfg = compose_train([f"experiment={recipe}", f"data_root={real_data_root}", f"output_dir={tmp_path / 'run'}",
                         "+model.adaptive_layers.n_layers_per_step=1"])
    with pytest.raises(ConfigError, match=r"model\.adaptive_layers=\{'n_layers_per_step': 1\}: \w+ does not train "
                                          "with adaptive layers; drop model.adaptive_layers"):
        check_train_config(cfg)


@pytest.mark.slow
def test_train_py_refuses_a_layer_beyond_the_model_in_one_line(real_data_root, tmp_path):
    run = tmp_path / "run"
    proc = run_train("experiment=quickstart_sup", f"data_root={real_data_root}", f"output_dir={run}",
                     "+model.adaptive_layers.prior_layers=[6]")
    assert_one_line_error(proc, error_starting("model.adaptive_layers.prior_layers=[6]: PromptBERTSup's model has "
                                               "6 layers"), run)
