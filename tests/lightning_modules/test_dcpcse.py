"""DCPCSE: deep prompts on a frozen encoder, equal to the official computation (tests/lightning_modules/
dcpcse_reference.py: YJiangcm/DCPCSE at 4b319380fa13d018811dd0631bcbeee838c3218e on transformers 4.2.1's attention,
written out) in embeddings, losses and gradients; only the prefixes and the MLP train; bad settings are one line."""

import numpy as np
import pytest
import torch

from promptemb.common.errors import ConfigError
from promptemb.encoder.model import InferenceOptions
from promptemb.encoder.template import Template
from promptemb.lightning_modules.dcpcse import DCPCSE, energy_hinge
from promptemb.lightning_modules.deep_prompt import (
    DeepPrompt,
    DeepPromptConfig,
    check_deep_prompt_model,
    extend_attention_mask,
)
from promptemb.poolers.cls import CLSPooler
from tests.helpers import assert_close_scaled, assert_tensors_close
from tests.lightning_modules.dcpcse_reference import official_cl_loss, official_pooled

SENTENCES = ["a man plays a guitar .", "two dogs run in a field while a plane lands at night",
             "the sun is shining", "a child reads a book on the sofa"]
TRIPLETS = [("a man plays a guitar .", "a woman is slicing onions", "the sun is shining"),
            ("two dogs run in a field", "a child reads a book on the sofa", "stocks fell sharply on monday ."),
            ("the café in Zürich is open", "a man is playing a guitar in the park", "the sentence means it")]
#: float32 forwards of the same computation in two layouts (a prefix concatenated vs. an explicit reference): round-off
#: of each tensor's largest entry; the bar of the issue is 1e-4
RTOL = 1e-4


def build(model_dir, *, projection=False, mlp_only_train=True, eh_loss_weight=0.0, pre_seq_len=5, seed=0):
    torch.manual_seed(seed)
    module = DCPCSE(str(model_dir), pre_seq_len=pre_seq_len, prefix_projection=projection, prefix_hidden_size=24,
                    mlp_only_train=mlp_only_train, eh_loss_weight=eh_loss_weight)
    with torch.no_grad():  # prefixes far from their init, so a misplaced prefix would show; the head drawn so its
        # tanh is not saturated (a saturated one has gradients of round-off size)
        for parameter in module.deep_prompt.parameters():
            parameter.normal_(0.0, 0.5)
        for parameter in module.mlp.parameters():
            parameter.normal_(0.0, 0.1)
        # A freshly initialised tiny model (std 0.02) gives every sentence nearly the same [CLS] state (cosines of
        # 1 - 1e-6), where float32 similarities cannot resolve the loss's gradient: weights of a trained model's
        # scale make the sentences' embeddings differ.
        for parameter in module.transformer.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.2)
    return module.eval()


def official_inputs(module, sentences):
    """The official tokenization: tokenizer(sentences, max_length=32, truncation=True), padded to the longest."""
    encoded = module.tokenizer(sentences, max_length=32, truncation=True, padding=True, return_tensors="pt")
    return encoded["input_ids"], encoded["attention_mask"]


def official(module, sentences, *, with_mlp, roberta):
    input_ids, attention_mask = official_inputs(module, sentences)
    return official_pooled(module.transformer, dict(module.deep_prompt.named_parameters()),
                           dict(module.mlp.named_parameters()), input_ids, attention_mask,
                           pre_seq_len=module.deep_prompt.length,
                           prefix_projection=module.deep_prompt.config.projection, roberta=roberta,
                           with_mlp=with_mlp)


def family(request, name):
    return request.getfixturevalue(name), name == "tiny_roberta"


@pytest.mark.parametrize("model", ["tiny_bert", "tiny_roberta"])
@pytest.mark.parametrize("projection", [False, True])
def test_embeddings_equal_the_official_computation(request, model, projection):
    model_dir, roberta = family(request, model)
    for mlp_only_train in (True, False):
        module = build(model_dir, projection=projection, mlp_only_train=mlp_only_train)
        want = official(module, SENTENCES, with_mlp=not mlp_only_train, roberta=roberta)
        pooler = module.eval_poolers()[0]
        assert isinstance(pooler, CLSPooler) and (pooler.head is None) == mlp_only_train
        with torch.no_grad():
            training_path = module.pooled(SENTENCES, module.builders[0], pooler)  # explicit positions, 4D masks
        scored = module.evaluation_encoder().embed(SENTENCES, [pooler], Template("[X]"))[pooler.name]
        assert_close_scaled(training_path, want, RTOL, msg=f"training forward, mlp_only_train={mlp_only_train}")
        assert_close_scaled(scored, want, RTOL, msg=f"evaluation encoder, mlp_only_train={mlp_only_train}")


@pytest.mark.parametrize("model", ["tiny_bert", "tiny_roberta"])
def test_unsupervised_loss_equals_the_official(request, model):
    """Two views of each sentence through the MLP (cl_forward with num_sent=2). In eval mode the views are equal, so
    the loss sits near its floor and its gradient is round-off: gradients are compared on pairs (next test)."""
    model_dir, roberta = family(request, model)
    module = build(model_dir, projection=True)
    anchors, positives, negatives = module.contrastive_views(SENTENCES)
    assert negatives is None and anchors.shape == positives.shape == (len(SENTENCES), 32)
    pooled = official(module, SENTENCES, with_mlp=True, roberta=roberta)
    assert_close_scaled(anchors, pooled, RTOL, msg="first view")
    assert_close_scaled(positives, pooled, RTOL, msg="second view")
    want = official_cl_loss(torch.stack([pooled, pooled], dim=1), temp=0.05)
    assert_close_scaled(module.contrastive_objective(anchors, positives, negatives), want, RTOL, msg="loss")


@pytest.mark.parametrize("model", ["tiny_bert", "tiny_roberta"])
def test_pair_loss_and_gradients_equal_the_official(request, model):
    """(sentence, positive) pairs: the official 2-column csv, cl_forward with num_sent=2 on distinct sentences."""
    model_dir, roberta = family(request, model)
    pairs = [triplet[:2] for triplet in TRIPLETS]
    module = build(model_dir, projection=True)
    loss = module.contrastive_objective(*module.contrastive_views(pairs))
    loss.backward()
    ours = {name: p.grad.clone() for name, p in module.named_parameters() if p.requires_grad}

    reference = build(model_dir, projection=True)
    flat = [sentence for pair in pairs for sentence in pair]
    want = official_cl_loss(official(reference, flat, with_mlp=True, roberta=roberta).view(len(pairs), 2, -1),
                            temp=0.05)
    want.backward()
    theirs = {name: p.grad.clone() for name, p in reference.named_parameters() if p.requires_grad}
    assert_close_scaled(loss, want, RTOL, msg="loss")
    assert_tensors_close(ours, theirs, RTOL)
    assert sorted(ours) == ["deep_prompt.embedding.weight", "deep_prompt.trans.0.bias", "deep_prompt.trans.0.weight",
                            "deep_prompt.trans.2.bias", "deep_prompt.trans.2.weight", "mlp.dense.bias",
                            "mlp.dense.weight"]


@pytest.mark.parametrize("model", ["tiny_bert", "tiny_roberta"])
def test_supervised_loss_with_energy_hinge_and_gradients_equal_the_official(request, model):
    model_dir, roberta = family(request, model)
    module = build(model_dir, mlp_only_train=False, eh_loss_weight=10.0)
    anchors, positives, negatives = module.contrastive_views(TRIPLETS)
    loss = module.contrastive_objective(anchors, positives, negatives)
    loss.backward()
    ours = {name: p.grad.clone() for name, p in module.named_parameters() if p.requires_grad}

    reference = build(model_dir, mlp_only_train=False, eh_loss_weight=10.0)
    flat = [sentence for triplet in TRIPLETS for sentence in triplet]
    pooled = official(reference, flat, with_mlp=True, roberta=roberta).view(len(TRIPLETS), 3, -1)
    want = official_cl_loss(pooled, temp=0.05, do_eh_loss=True, eh_loss_margin=0.2, eh_loss_weight=10.0)
    want.backward()
    theirs = {name: p.grad.clone() for name, p in reference.named_parameters() if p.requires_grad}
    hinge = energy_hinge(anchors, positives, negatives, 0.2)
    assert float(hinge.detach()) > 0  # the hinge term is active: the comparison covers it
    assert_close_scaled(loss, want, RTOL, msg="loss")
    assert_tensors_close(ours, theirs, RTOL)
    assert sorted(ours) == ["deep_prompt.embedding.weight", "mlp.dense.bias", "mlp.dense.weight"]


def test_batches_encoded_in_parallel_threads_get_their_own_prefixes(tiny_bert):
    """`backbone.parallel_batches`: batches of different sizes run at once on the same hooked model."""
    module = build(tiny_bert)
    sentences = SENTENCES * 5 + ["short"]
    encoder = module.evaluation_encoder(batch_size=3)
    sequential = encoder.embed(sentences, [module.pooler], Template("[X]"))["cls"]
    encoder.use_inference_options(InferenceOptions(parallel_batches=2))
    parallel = encoder.embed(sentences, [module.pooler], Template("[X]"))["cls"]
    assert_close_scaled(parallel, sequential, RTOL)
    assert module.deep_prompt._layers == {}  # released after each forward


def test_only_the_prefixes_and_the_mlp_change(tiny_bert):
    module = build(tiny_bert).train()
    before = {name: p.detach().clone() for name, p in module.named_parameters()}
    optimizer = torch.optim.AdamW([p for p in module.parameters() if p.requires_grad], lr=1e-2)
    module.contrastive_objective(*module.contrastive_views(SENTENCES)).backward()
    optimizer.step()
    changed = sorted(name for name, p in module.named_parameters() if not torch.equal(p, before[name]))
    assert changed == ["deep_prompt.embedding.weight", "mlp.dense.bias", "mlp.dense.weight"]


def test_prefix_dropout_is_drawn_per_row_in_training_only():
    config = DeepPromptConfig(length=3, num_layers=2, num_heads=2, hidden_size=8, dropout=0.5)
    prompt = DeepPrompt(config)
    key, value = prompt.eval().key_values(4)[1]
    assert key.shape == value.shape == (4, 2, 3, 4)
    assert torch.equal(key[0], key[3])  # eval: every row the same prefixes
    # layer 1's key is slot 2 of the official view(P, 2·layers, heads, d)
    torch.testing.assert_close(key[0], prompt.embedding.weight.view(3, 4, 2, 4)[:, 2].permute(1, 0, 2))
    torch.manual_seed(0)
    dropped, _ = prompt.train().key_values(4)[1]
    assert not torch.equal(dropped[0], dropped[3])


def test_save_and_load_keep_the_prefixes(tmp_path):
    prompt = DeepPrompt(DeepPromptConfig(length=4, num_layers=2, num_heads=2, hidden_size=8, projection=True,
                                         projection_hidden_size=6))
    prompt.save(tmp_path)
    loaded = DeepPrompt.load(tmp_path)
    assert loaded.config == prompt.config
    assert all(torch.equal(a, b) for a, b in zip(prompt.state_dict().values(), loaded.state_dict().values()))
    # the official PrefixEncoder's parameter names: an official checkpoint's `prefix_encoder.*` loads as it is
    assert sorted(prompt.state_dict()) == ["embedding.weight", "trans.0.bias", "trans.0.weight", "trans.2.bias",
                                           "trans.2.weight"]
    (tmp_path / "promptemb_deep_prompt.json").write_text('{"length": 4, "num_layers": 3, "num_heads": 2, '
                                                         '"hidden_size": 8, "projection": true, '
                                                         '"projection_hidden_size": 6}')
    with pytest.raises(ConfigError, match="does not fit its config"):
        DeepPrompt.load(tmp_path)
    with pytest.raises(ConfigError, match="not an export with deep prompts"):
        DeepPrompt.load(tmp_path / "missing")


def test_attention_masks_gain_visible_prefix_columns():
    boolean = torch.tensor([[True, False]]).view(1, 1, 1, 2)
    assert extend_attention_mask(boolean, 2).tolist() == [[[[True, True, True, False]]]]
    additive = torch.tensor([0.0, -1e9]).view(1, 1, 1, 2)
    assert extend_attention_mask(additive, 1).tolist() == [[[[0.0, 0.0, -1e9]]]]
    assert extend_attention_mask(None, 3) is None
    with pytest.raises(ValueError, match="4D attention masks"):
        extend_attention_mask(torch.ones(2, 3), 1)


@pytest.mark.parametrize(("settings", "message"), [
    ({"gradient_checkpointing": True}, "activation checkpointing"),
    ({"grad_cache_chunk_size": 4}, "gradient caching"),
    ({"denoise": True}, "there is no template"),
])
def test_unsupported_settings_are_refused_before_loading(settings, message):
    with pytest.raises(ConfigError, match=message):
        DCPCSE("no/such/model", **settings)  # refused before the model path is looked at


def test_a_decoder_is_refused_before_its_weights_load(tmp_path, monkeypatch):
    import promptemb.encoder.loading as loading
    from tests.decoder_helpers import save_tiny_decoder

    decoder = save_tiny_decoder(tmp_path / "llama", "llama", layers=1, hidden=16)
    monkeypatch.setattr(loading, "load_pretrained", lambda *a, **k: pytest.fail("weights loaded"))
    with pytest.raises(ConfigError, match=r"implemented for bert and roberta encoders.*the model is llama"):
        DCPCSE(str(decoder))


def test_refusals_of_models_and_lengths(tiny_bert):
    from transformers import BertConfig

    with pytest.raises(ConfigError, match="configured as a decoder"):
        check_deep_prompt_model(BertConfig(is_decoder=True))
    with pytest.raises(ConfigError, match="not 'flash_attention_2'"):
        check_deep_prompt_model(BertConfig(attn_implementation="flash_attention_2"))
    with pytest.raises(ConfigError, match="position_embedding_type=relative_key"):
        check_deep_prompt_model(BertConfig(position_embedding_type="relative_key"))
    with pytest.raises(ConfigError, match="leaves no room"):
        DCPCSE(str(tiny_bert), pre_seq_len=127)  # the tiny BERT has 128 positions
    with pytest.raises(ConfigError, match=r"trainer\.compile"):
        DCPCSE.check_compile({})
    prompt = DeepPrompt(DeepPromptConfig(length=2, num_layers=5, num_heads=4, hidden_size=32))
    module = build(tiny_bert)
    with pytest.raises(ConfigError, match="num_layers=5, the model 3"):
        prompt.attach(module.transformer)


def test_positions_start_after_the_prefix(tiny_bert):
    """The official positions (transformers 4.x with past_key_values: P .. P+L-1) are the ones used: the embeddings'
    position ids are shifted, in the model's default and in the training forward's explicit ones."""
    module = build(tiny_bert)
    seen = []
    handle = module.transformer.embeddings.position_embeddings.register_forward_hook(
        lambda m, args, out: seen.append(args[0]))
    with torch.no_grad():
        module.pooled(["a b c"], module.builders[0], module.pooler)
        ids, mask = official_inputs(module, ["a b c"])
        module.transformer(input_ids=ids, attention_mask=mask)
    handle.remove()
    expected = list(range(5, 5 + ids.shape[1]))
    assert [row.tolist() for row in seen] == [[expected], [expected]]


# ---- train.py: the experiments through the real Trainer, and what is refused before any model loads ----------------

def dcpcse_command(name, model_dir, root, out, *extra):
    return [f"experiment={name}", f"backbone.name_or_path={model_dir}", f"data_root={root}", f"output_dir={out}",
            "data.batch_size=4", "trainer.max_steps=2", "eval_every_n_steps=2",
            "callbacks.sts_evaluation.final_tasks=[STSBenchmark]", *extra]


@pytest.mark.parametrize(("name", "model"), [("quickstart_dcpcse_unsup", "tiny_bert"),
                                             ("quickstart_dcpcse_sup", "tiny_roberta")])
def test_the_quickstarts_train_score_reload_and_export(request, name, model, real_data_root, tmp_path):
    """train.py with the real Trainer, the best checkpoint reloaded, and its export: the framework's export loader,
    `load_encoder` on the checkpoint and sentence-transformers on the export directory give the embeddings the run
    scored (the module's evaluation encoder with its [CLS] pooler)."""
    import json

    from promptemb.exporting.runner import export_checkpoint
    from promptemb.inference.prompt_encoder import load_encoder
    from promptemb.lightning_modules.checkpoint import load_module_checkpoint
    from promptemb.training.runner import train
    from tests.exporting.test_export import assert_same_embeddings, framework_embeddings, sentence_transformer
    from tests.training.test_train import checked, compose_train

    model_dir = request.getfixturevalue(model)
    out = tmp_path / "run"
    trainer = train(checked(compose_train(dcpcse_command(name, model_dir, real_data_root, out))))
    assert trainer.state.finished and trainer.global_step == 2
    results = json.loads((out / "results.json").read_text())
    assert set(results["scores"]) == {"cls", "avg"}
    best = next((out / "checkpoints").glob("step*.ckpt"))
    loaded = load_module_checkpoint(best).module
    supervised = name.endswith("_sup")
    assert isinstance(loaded, DCPCSE) and loaded.deep_prompt.length == (12 if supervised else 16)
    assert loaded.hparams.eh_loss_weight == (10.0 if supervised else 0.0)
    assert (loaded.eval_poolers()[0].head is not None) == supervised
    # the checkpoint holds the trained prefixes: a fresh module's differ
    fresh = DCPCSE(str(model_dir), pre_seq_len=loaded.deep_prompt.length)
    assert not torch.equal(fresh.deep_prompt.embedding.weight, loaded.deep_prompt.embedding.weight)

    sentences = [*SENTENCES, "short", "a very long sentence " * 20]  # lengths 1 .. past max_sentence_tokens
    reference = framework_embeddings(loaded, sentences)
    exported = export_checkpoint(best, tmp_path / "export")
    record = json.loads((exported / "config.json").read_text())["promptemb"]
    assert record["pooler"]["name"] == "cls" and (record["pooler"]["head"] is not None) == supervised
    assert record["deep_prompt"]["length"] == loaded.deep_prompt.length
    assert record["template"] == "[X]" and record["prefix_ids"] == record["suffix_ids"] == []
    assert "promptemb_deep_prompt.safetensors" in record["weights_sha256"]
    for got in (load_encoder(exported).encode(sentences), load_encoder(best).encode(sentences),
                sentence_transformer(exported).encode(sentences, batch_size=3, convert_to_numpy=True)):
        assert_same_embeddings(got, reference)
    # what evaluate.py opens (a checkpoint, a run folder, an export): the trained model's own [CLS] pooler
    from promptemb.inference.model_sources import open_trained_model

    for source in (best, out, exported):
        trained = open_trained_model(str(source), device="cpu")
        pooler = trained.poolers[0]
        assert pooler.name == "cls"
        got = trained.encoder.embed(sentences, [pooler], trained.template, trained.sentence_rule,
                                    trained.max_sentence_tokens)["cls"]
        assert_same_embeddings(got, reference)
    # without its prefixes the exported transformer gives other embeddings: the export carries them
    plain = load_encoder(exported)
    plain.deep_prompt.detach()
    assert not np.allclose(plain.encode(sentences), reference, atol=1e-3)
    avg = export_checkpoint(best, tmp_path / "avg", pooler="avg")
    assert_same_embeddings(load_encoder(avg).encode(sentences), framework_embeddings(loaded, sentences, 1))


@pytest.mark.parametrize(("overrides", "message"), [
    (["+model.gradient_checkpointing=true"], "DCPCSE does not train with activation checkpointing"),
    (["model.pre_seq_len=0"], "model.pre_seq_len=0: Input should be greater than or equal to 1"),
    (["model.eh_loss_weight=-1"], "model.eh_loss_weight=-1: Input should be greater than or equal to 0"),
    (["trainer.compile=true"], "trainer.compile=true"),
])
def test_bad_settings_are_one_line_before_loading(overrides, message, real_data_root, tmp_path, monkeypatch):
    import promptemb.encoder.loading as loading
    from tests.training.test_train import checked, compose_train

    monkeypatch.setattr(loading, "load_pretrained", lambda *a, **k: pytest.fail("weights loaded"))
    cfg = compose_train(["experiment=quickstart_dcpcse_sup", f"data_root={real_data_root}",
                         f"output_dir={tmp_path / 'run'}", *overrides])
    with pytest.raises(ConfigError) as caught:
        checked(cfg)
    assert message in str(caught.value) and "\n" not in str(caught.value)
    assert not (tmp_path / "run").exists()


def test_two_ranks_equal_one_process_on_the_joined_batch(tmp_path):
    """Anchors, positives and hard negatives gathered over 2 gloo ranks: InfoNCE plus the energy-based hinge loss and
    the (DDP-averaged, world-size-scaled) gradient equal one process's on the joined batch, as the official code
    gathers before both."""
    from tests.training.test_ddp import single_and_two_ranks

    single, ranks = single_and_two_ranks("dcpcse_ddp_worker.py", str(tmp_path / "result"))
    for ddp in ranks:
        torch.testing.assert_close(ddp["loss"], single["loss"], rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(ddp["grad"], single["grad"], rtol=1e-5, atol=1e-7)
