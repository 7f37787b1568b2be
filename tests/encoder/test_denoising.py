"""Template denoising: the batched bias equals a direct forward of the template alone with shifted positions."""

import pytest
import torch
from transformers import AutoModel, AutoTokenizer, RobertaConfig, RobertaModel

from promptemb.encoder.forward import position_base, template_bias, template_only_batch
from promptemb.encoder.inputs import InputBuilder, InputForm, collate
from promptemb.encoder.template import Template
from tests.helpers import assert_close_scaled, assert_tensors_close

#: Float32 forwards of one model in other batch shapes (the CPU's kernels order the sums): to FORWARD_TOL of the
#: compared tensor's largest entry.
FORWARD_TOL = 1e-5
#: The same in float64, where the compared values are differences that cancel (denoised views h - bias, gradients
#: summed over every token): float64 round-off of their largest entry is ~1e-15; FLOAT64_TOL leaves room for
#: cancellation and is far below what a wrong segment, position or bias would change (> 1e-3).
FLOAT64_TOL = 1e-9
PROMPTS = ['This sentence : "[X]" means [MASK] .', 'This sentence of "[X]" means [MASK] [MASK] .']


def direct_bias(model, tokenizer, builder, n, base=0):
    """Loop reference: one forward per length with hand-written position ids. The attention mask is passed: without
    one, transformers >= 5.25 reads the jump in the position ids as the start of a second packed sequence and stops
    the prefix and the suffix from attending to each other."""
    prefix, suffix = builder.prefix_ids, builder.suffix_ids
    ids = torch.tensor([[tokenizer.cls_token_id, *prefix, *suffix, tokenizer.sep_token_id]])
    positions = list(range(1 + len(prefix))) + [1 + len(prefix) + n + j for j in range(len(suffix) + 1)]
    with torch.no_grad():
        hidden = model(ids, attention_mask=torch.ones_like(ids),
                       position_ids=torch.tensor([positions]) + base).last_hidden_state[0]
    ids = ids[0].tolist()
    rows = [hidden[t] for t, token in enumerate(ids) if token == tokenizer.mask_token_id and 0 < t < len(ids) - 1]
    return torch.stack(rows).mean(0)


@pytest.mark.parametrize("prompt", PROMPTS)
def test_batched_bias_equals_direct_forward_per_length(tiny_bert, prompt):
    model = AutoModel.from_pretrained(tiny_bert).eval()
    tokenizer = AutoTokenizer.from_pretrained(tiny_bert)
    builder = InputBuilder(tokenizer, InputForm(Template(prompt)), 128)
    lengths = torch.tensor([3, 0, 7, 3, 11])
    with torch.no_grad():
        got = template_bias(model, builder, lengths)[model.config.num_hidden_layers]
    for row, n in enumerate(lengths.tolist()):
        assert_close_scaled(got[row], direct_bias(model, tokenizer, builder, n), FORWARD_TOL)


def test_shifted_positions_match_the_real_input(tiny_bert):
    """Every template token of the bias input sits at the position it has next to an n-token sentence."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_bert)
    builder = InputBuilder(tokenizer, InputForm(Template(PROMPTS[0])), 128)
    sentence = "a man plays a large guitar"
    real = collate(builder.build([sentence]), 0, tokenizer.mask_token_id)
    n = int(real.sentence_lengths[0])
    bias = template_only_batch(builder, torch.tensor([n]), base=0)
    real_template_positions = [t for t in range(real.input_ids.shape[1]) if int(real.roles[0, t]) != 2]
    assert bias.position_ids[0].tolist() == real_template_positions
    assert bias.input_ids[0].tolist() == [int(real.input_ids[0, t]) for t in real_template_positions]


def test_roberta_positions_start_after_padding_idx(tiny_bert):
    tokenizer = AutoTokenizer.from_pretrained(tiny_bert)
    config = RobertaConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                           intermediate_size=64, max_position_embeddings=130, pad_token_id=1)
    torch.manual_seed(0)
    model = RobertaModel(config).eval()
    assert position_base(model) == 2
    builder = InputBuilder(tokenizer, InputForm(Template(PROMPTS[0])), 128)
    with torch.no_grad():
        got = template_bias(model, builder, torch.tensor([4]))[2]
    assert_close_scaled(got[0], direct_bias(model, tokenizer, builder, 4, base=2), FORWARD_TOL)


def test_gradients_flow_through_bias_unless_frozen(tiny_bert):
    from promptemb.lightning_modules.promptbert import PromptBERTUnsup

    sentences = ["a cat sits", "two dogs run in the park"]
    grads = {}
    for frozen in (False, True):
        torch.manual_seed(0)
        module = PromptBERTUnsup(str(tiny_bert), freeze_bias=frozen).eval()
        pooled = module.pooled(sentences, module.builders[0], module.train_pooler)
        # (a plain sum of LayerNorm outputs is constant at init, so project on fixed random weights)
        (pooled * torch.linspace(-1, 1, pooled.shape[-1])).sum().backward()
        grads[frozen] = (pooled.detach(), module.transformer.embeddings.position_embeddings.weight.grad.clone())
    torch.testing.assert_close(grads[False][0], grads[True][0])  # same value
    difference = (grads[False][1] - grads[True][1]).abs().max()
    assert difference > 1e-3 * grads[False][1].abs().max()  # the bias path carries gradient unless frozen


def test_biases_of_several_templates_in_one_forward_equal_separate_ones(tiny_bert):
    from promptemb.encoder.forward import template_biases

    model = AutoModel.from_pretrained(tiny_bert).eval()
    tokenizer = AutoTokenizer.from_pretrained(tiny_bert)
    builders = [InputBuilder(tokenizer, InputForm(Template(p)), 128) for p in (*PROMPTS, "[X] [MASK]")]
    lengths = [torch.tensor([3, 5, 3]), torch.tensor([9]), torch.tensor([0, 2])]
    with torch.no_grad():
        together = template_biases(model, builders, lengths)
        for builder, n, joint in zip(builders, lengths, together, strict=True):
            alone = template_bias(model, builder, n)
            last = model.config.num_hidden_layers
            assert_close_scaled(joint[last], alone[last], FORWARD_TOL)


@pytest.mark.parametrize("denoise", [False, True])
def test_two_views_in_one_forward_equal_one_forward_per_view(tiny_bert, denoise):
    """pooled_views runs every view's sentences, and when denoising their template biases, in ONE forward; the rows
    are those of a forward per view (eval mode: no dropout), padding to the wider view changes nothing."""
    from promptemb.lightning_modules.promptbert import PromptBERTUnsup

    module = PromptBERTUnsup(str(tiny_bert), denoise=denoise).eval()
    sentences = ["a cat sits", "two dogs run in the park today", "ok"]
    calls = []
    handle = module.transformer.register_forward_hook(lambda mod, args, kwargs_out: calls.append(1))
    with torch.no_grad():
        joint = module.pooled_views(sentences, module.builders, module.train_pooler)
        forwards = len(calls)
        alone = [module.pooled(sentences, builder, module.train_pooler) for builder in module.builders]
    handle.remove()
    assert forwards == 1
    for got, expected in zip(joint, alone, strict=True):
        assert got.shape == (3, module.transformer.config.hidden_size)
        assert_close_scaled(got, expected, FORWARD_TOL)


#: Sentences of 15 distinct lengths (0 .. 17 tokens): several bias rows per view, several segments per row.
MANY_LENGTHS = ["", "a", "a cat", *(" ".join(["two dogs run in the park"] * k + ["today"] * j)
                                    for k in (1, 2) for j in range(6)), "ok", "a cat", ""]


def separate_bias_forward(module, sentences, builders, pooler) -> list[torch.Tensor]:
    """The reference computation: the views in one forward, then the biases of their distinct lengths in a forward
    of their own (template alone, shifted positions; `template_biases`), subtracted by the pooler."""
    from dataclasses import replace

    from promptemb.encoder.forward import concat_batches, run_transformer, template_biases

    batches = [module.view_batch(sentences, builder) for builder in builders]
    merged = concat_batches(batches, module.tokenizer.pad_token_id)
    needs = pooler.needs
    out = run_transformer(module.transformer, merged, replace(needs, template_bias=False),
                          input_embedder=module.input_embedder)
    with torch.no_grad() if module.hparams.freeze_bias else torch.enable_grad():
        biases = template_biases(module.transformer, builders, [b.sentence_lengths for b in batches], needs.layers,
                                 input_embedder=module.input_embedder)
    out.template_bias = {layer: torch.cat([bias[layer] for bias in biases]) for layer in biases[0]}
    return list(pooler(out).split([b.input_ids.shape[0] for b in batches]))


def values_and_gradients(module, views: list[torch.Tensor]):
    projection = torch.linspace(-1, 1, views[0].shape[-1])  # a plain sum of LayerNorm outputs is constant
    loss = sum(((view * projection).sum(-1) ** 2).sum() * (index + 1) for index, view in enumerate(views))
    module.zero_grad()
    loss.backward()
    grads = {name: p.grad.clone() for name, p in module.named_parameters() if p.grad is not None}
    return [view.detach() for view in views], grads


def recipe(name, tiny_bert, tiny_roberta, **kwargs):
    from promptemb.lightning_modules.optiprompt import OptiPrompt
    from promptemb.lightning_modules.promptbert import PromptBERTSup, PromptBERTUnsup

    if name == "unsup":
        module = PromptBERTUnsup(str(tiny_bert), **kwargs)
        return module, module.builders, module.train_pooler
    if name == "unsup_two_masks":
        module = PromptBERTUnsup(str(tiny_bert), templates=[PROMPTS[1], PROMPTS[0]], **kwargs)
        return module, module.builders, module.train_pooler
    if name == "sup_roberta":
        module = PromptBERTSup(str(tiny_roberta), templates=["This sentence : '[X]' means [MASK] ."],
                               head_type="tanh_mlp", **kwargs)
        return module, module.builders, module.pooler
    module = OptiPrompt(str(tiny_bert), denoise=True, **kwargs)  # the soft template in sentence and bias rows
    return module, module.builders, module.pooler


@pytest.mark.parametrize("name, kwargs", [("unsup", {}), ("unsup", {"freeze_bias": True}), ("unsup_two_masks", {}),
                                          ("sup_roberta", {}), ("optiprompt", {})])
def test_biases_folded_into_the_sentence_forward_give_the_separate_forwards_values_and_gradients(
        name, kwargs, tiny_bert, tiny_roberta):
    """The training forward packs each view's template-only segments into extra rows of the sentence batch
    (encoder/folded_forward.py); pooled views and every parameter's gradient equal the reference computation's
    (views, then a bias forward of their own), for one and two [MASK]s, RoBERTa's positions from padding_idx + 1,
    a frozen bias and OptiPrompt's soft template."""
    module, builders, pooler = recipe(name, tiny_bert, tiny_roberta, **kwargs)
    # float64: both computations exact to float64 round-off (the gradients sum thousands of float32 terms that
    # cancel, whose float32 round-off the CPU's kernels order differently); the tiny models have no dropout:
    # training mode, deterministic
    module.double().train()
    folded = values_and_gradients(module, module.pooled_views(MANY_LENGTHS, builders, pooler))
    reference = values_and_gradients(module, separate_bias_forward(module, MANY_LENGTHS, builders, pooler))
    for got, expected in zip(folded[0], reference[0], strict=True):
        assert_close_scaled(got, expected, FLOAT64_TOL)
    assert folded[1] and len(folded[1]) == len(reference[1])
    assert_tensors_close(folded[1], reference[1], FLOAT64_TOL)


def test_packing_puts_several_segments_in_a_row_each_attending_to_itself(tiny_bert):
    from promptemb.encoder.folded_forward import bias_rows_needed, plan_bias_rows
    from promptemb.lightning_modules.promptbert import PromptBERTUnsup

    module = PromptBERTUnsup(str(tiny_bert))
    builder = module.builders[0]
    segment = 2 + len(builder.prefix_ids) + len(builder.suffix_ids)
    lengths = torch.tensor([5, 0, 5, 3, 9, 3, 1])  # 5 distinct
    width = 3 * segment + 1  # 3 segments to a row; sentences of up to 2 * segment + 1 tokens
    rows = plan_bias_rows([builder], [lengths], width, 0, 0, torch.device("cpu"))
    assert rows.input_ids.shape == (2, width)
    assert rows.segments[0].tolist() == [0] * segment + [1] * segment + [2] * segment + [-1]
    assert rows.segments[1].tolist() == [0] * segment + [1] * segment + [-1] * (width - 2 * segment)
    for distinct, n in enumerate([0, 1, 3, 5, 9]):  # sorted distinct lengths, segment by segment
        row, slot = divmod(distinct, 3)
        expected = template_only_batch(builder, torch.tensor([n]), base=0)
        span = slice(slot * segment, (slot + 1) * segment)
        assert rows.input_ids[row, span].tolist() == expected.input_ids[0].tolist()
        assert rows.position_ids[row, span].tolist() == expected.position_ids[0].tolist()
    assert rows.row_segment.tolist() == [3, 0, 3, 2, 4, 2, 1]
    padded = plan_bias_rows([builder], [lengths], width, 0, 0, torch.device("cpu"),
                            rows=bias_rows_needed([builder], width))
    assert padded.input_ids.shape == (-(-(2 * segment + 2) // 3), width)  # every length 0 .. 2 * segment + 1
    assert padded.row_segment.tolist() == rows.row_segment.tolist()


def test_bucketed_widths_and_padded_bias_rows_change_no_value(tiny_bert):
    """What `trainer.compile=true` feeds the compiled forward: views padded to a length bucket, bias rows padded to
    what that width can need. Same values as the exact shapes."""
    from promptemb.lightning_modules.promptbert import PromptBERTUnsup

    module = PromptBERTUnsup(str(tiny_bert)).double().eval()  # float64: h - bias cancels; see FLOAT64_TOL
    with torch.no_grad():
        exact = module.pooled_views(MANY_LENGTHS, module.builders, module.train_pooler)
        module.length_buckets = (8, 16, 32)
        widths = []
        handle = module.transformer.register_forward_pre_hook(
            lambda mod, args, kwargs: widths.append(tuple(kwargs["position_ids"].shape)), with_kwargs=True)
        bucketed = module.pooled_views(MANY_LENGTHS, module.builders, module.train_pooler)
        handle.remove()
    segment = 2 + len(module.builders[0].prefix_ids) + len(module.builders[0].suffix_ids)
    assert widths[0][1] == segment + 32  # longest sentence 17 tokens -> bucket 32
    for got, expected in zip(bucketed, exact, strict=True):
        assert_close_scaled(got, expected, FLOAT64_TOL)


def test_explicit_positions_always_go_with_a_mask(tiny_bert):
    """An unpadded batch may run without its mask, but not one with explicit position ids (transformers >= 5.25
    would split the template bias rows at their position jump): the same states as with the mask."""
    from promptemb.encoder.forward import run_transformer
    from promptemb.encoder.pooling import Needs

    model = AutoModel.from_pretrained(tiny_bert).eval()
    tokenizer = AutoTokenizer.from_pretrained(tiny_bert)
    builder = InputBuilder(tokenizer, InputForm(Template(PROMPTS[0])), 128)
    batch = template_only_batch(builder, torch.tensor([5]), base=0)
    layer = model.config.num_hidden_layers
    with torch.no_grad():
        masked = run_transformer(model, batch, Needs(layers=(layer,))).hidden_states[layer]
        unmasked_allowed = run_transformer(model, batch, Needs(layers=(layer,)),
                                           mask_only_when_padded=True).hidden_states[layer]
    assert_close_scaled(unmasked_allowed, masked, FORWARD_TOL)
    assert_close_scaled(masked[0, batch.mask_token[0]].mean(0), direct_bias(model, tokenizer, builder, 5),
                        FORWARD_TOL)
