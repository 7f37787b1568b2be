"""Template denoising on MPNet (all-mpnet-base-v2's architecture) vs BERT: what the position shift changes.

The template bias for a sentence of n tokens is the [MASK] state of `[CLS] prefix suffix [SEP]` with the position ids
after the prefix shifted by +n. Exactly: it is the [MASK] state of the real input `[CLS] prefix s_1..s_n suffix [SEP]`
in which the template cannot attend to the sentence (a 4D mask). BERT has absolute positions only, so the shift alone
gives that. MPNet adds a relative position bias that transformers computes from the columns 0..T-1, ignoring the
position ids (`MPNetEncoder.compute_position_bias(hidden_states)`): with transformers' own forward the shift moves only
MPNet's absolute embeddings, and the prefix sits 1 column from the suffix instead of n + 1, so the bias is NOT that
state. `relative_positions_from_ids` (used by every forward of the library) computes the bias from the position ids.
"""

import pytest
import torch
from transformers import AutoModel, AutoTokenizer

from promptemb.encoder.folded_forward import attention_mask_4d
from promptemb.encoder.forward import position_base, relative_positions_from_ids, template_bias, template_only_batch
from promptemb.encoder.inputs import SENTENCE, InputBuilder, InputForm
from promptemb.encoder.template import Template

TEMPLATE = 'This sentence : "[X]" means [MASK] .'
TOL = 1e-5  # float32 forwards of the same values in other shapes


@pytest.fixture(scope="module")
def models(tiny_bert, tiny_mpnet):
    """name -> (tokenizer, eval model): the tiny BERT and the tiny MPNet (its own `<s>`/`</s>`/`<mask>` ids)."""
    return {name: (AutoTokenizer.from_pretrained(path),
                   AutoModel.from_pretrained(path, attn_implementation="eager").eval())
            for name, path in (("bert", tiny_bert), ("mpnet", tiny_mpnet))}


def masked_real_input_state(model, builder, sentence: str) -> tuple[torch.Tensor, int]:
    """[MASK] state of the real templated input with the sentence hidden from the template (4D mask), positions as in
    evaluation (position_base + column: consecutive ids, so the relative bias is transformers' own)."""
    item = builder.build([sentence])[0]
    ids = torch.tensor([item.input_ids])
    segments = (torch.tensor([item.roles]) == SENTENCE).long()  # template and specials: segment 0; sentence: 1
    positions = torch.arange(ids.shape[1]).unsqueeze(0) + position_base(model)
    mask = attention_mask_4d(segments, model.config._attn_implementation, torch.float32)
    with torch.no_grad():
        hidden = model(input_ids=ids, attention_mask=mask, position_ids=positions).last_hidden_state
    return hidden[0, item.input_ids.index(builder.tokenizer.mask_token_id)], item.sentence_length


def transformers_shifted_template_state(model, builder, n: int) -> torch.Tensor:
    """The [MASK] state of `[CLS] prefix suffix [SEP]`, positions after the prefix shifted by +n, through
    transformers' own forward (no `relative_positions_from_ids`; the mask passed, as the library always does with
    explicit position ids: without one, transformers >= 5.25 reads the position jump as a second packed sequence)."""
    batch = template_only_batch(builder, torch.tensor([n]), position_base(model))
    with torch.no_grad():
        hidden = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                       position_ids=batch.position_ids).last_hidden_state
    return hidden[batch.mask_token][0]


@pytest.mark.parametrize("name", ["bert", "mpnet"])
def test_template_bias_is_the_real_input_with_the_sentence_hidden(models, name):
    tokenizer, model = models[name]
    builder = InputBuilder(tokenizer, InputForm(Template(TEMPLATE)), 128)
    for sentence in ["a man plays a guitar", "two dogs run in a field while a plane lands at night"]:
        expected, n = masked_real_input_state(model, builder, sentence)
        with torch.no_grad():
            bias = template_bias(model, builder, torch.tensor([n]))[model.config.num_hidden_layers][0]
        assert (bias - expected).abs().max() <= TOL * expected.abs().max()


def test_transformers_mpnet_forward_shifts_only_the_absolute_positions(models):
    """Through transformers' own forward the shifted template-only row gives BERT's bias, but on MPNet a different
    state (its relative bias sees the suffix 1 column after the prefix, not n + 1): 100x rounding apart or more."""
    for name, moved in (("bert", False), ("mpnet", True)):
        tokenizer, model = models[name]
        builder = InputBuilder(tokenizer, InputForm(Template(TEMPLATE)), 128)
        expected, n = masked_real_input_state(model, builder, "two dogs run in a field while a plane lands at night")
        gap = float((transformers_shifted_template_state(model, builder, n) - expected).abs().max()
                    / expected.abs().max())
        assert (gap > 100 * TOL) if moved else (gap <= TOL), (name, n, gap)
        if moved:  # with n = 0 (no sentence) the columns are the positions: transformers' forward is right again
            expected0, _ = masked_real_input_state(model, builder, "")
            assert (transformers_shifted_template_state(model, builder, 0) - expected0).abs().max() <= (
                TOL * expected0.abs().max())


def test_relative_bias_from_consecutive_ids_is_transformers_own(models):
    """For rows whose ids are consecutive (every evaluation row, from any first id) the bias is transformers' own."""
    _, model = models["mpnet"]
    hidden = torch.zeros(2, 9, 32)
    own = model.encoder.compute_position_bias(hidden)
    positions = torch.arange(9).expand(2, 9) + torch.tensor([[2], [7]])
    with relative_positions_from_ids(model, positions):
        assert torch.equal(model.encoder.compute_position_bias(hidden), own)
    assert "compute_position_bias" not in vars(model.encoder)  # the class's method again after the block


def test_an_architecture_without_sdpa_loads_eager_and_records_it(tiny_bert, tiny_mpnet):
    """transformers has no SDPA attention for MPNet: the Encoder loads its eager attention (the same function) and
    its provenance says so, instead of failing on `attn_implementation="sdpa"`; the template finds `<mask>`."""
    from promptemb.encoder.model import Encoder

    encoder = Encoder(str(tiny_mpnet), batch_size=2, progress=False)
    assert encoder.describe()["attention"] == "eager" and encoder.describe()["class"] == "MPNetModel"
    assert Encoder(str(tiny_bert), batch_size=2, progress=False).describe()["attention"] == "sdpa"
    builder = InputBuilder(encoder.tokenizer, InputForm(Template(TEMPLATE)), 128)
    assert encoder.tokenizer.convert_ids_to_tokens(builder.build(["a man ."])[0].input_ids) == [
        "<s>", "this", "sentence", ":", '"', "a", "man", ".", '"', "means", "<mask>", ".", "</s>"]
