"""Template denoising: the batched bias equals a direct forward of the template alone with shifted positions."""

import pytest
import torch
from transformers import AutoModel, AutoTokenizer, RobertaConfig, RobertaModel

from promptemb.encoder.forward import position_base, template_bias, template_only_batch
from promptemb.encoder.inputs import InputBuilder, InputForm, collate
from promptemb.encoder.template import Template

PROMPTS = ['This sentence : "[X]" means [MASK] .', 'This sentence of "[X]" means [MASK] [MASK] .']


def direct_bias(model, tokenizer, builder, n, base=0):
    """Loop reference: one forward per length with hand-written position ids."""
    prefix, suffix = builder.prefix_ids, builder.suffix_ids
    ids = [tokenizer.cls_token_id, *prefix, *suffix, tokenizer.sep_token_id]
    positions = list(range(1 + len(prefix))) + [1 + len(prefix) + n + j for j in range(len(suffix) + 1)]
    with torch.no_grad():
        hidden = model(torch.tensor([ids]), position_ids=torch.tensor([positions]) + base).last_hidden_state[0]
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
        torch.testing.assert_close(got[row], direct_bias(model, tokenizer, builder, n), atol=1e-5, rtol=1e-5)


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
    torch.testing.assert_close(got[0], direct_bias(model, tokenizer, builder, 4, base=2), atol=1e-5, rtol=1e-5)


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
            torch.testing.assert_close(joint[last], alone[last], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("denoise", [False, True])
def test_two_views_in_one_forward_equal_one_forward_per_view(tiny_bert, denoise):
    """pooled_views runs every view's sentences in ONE forward (+ one bias forward when denoising); the rows are
    those of a forward per view (eval mode: no dropout), padding to the wider view changes nothing."""
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
    assert forwards == (2 if denoise else 1)
    for got, expected in zip(joint, alone, strict=True):
        assert got.shape == (3, module.transformer.config.hidden_size)
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
