"""Token-level templating: layout, roles, truncation of the sentence only, multi-[MASK], sentence rules, errors."""

import pytest
from transformers import AutoTokenizer

from promptemb.common.errors import ConfigError
from promptemb.encoder.inputs import PAD, SENTENCE, SPECIAL, TEMPLATE, InputBuilder, InputForm, collate
from promptemb.encoder.loading import resolve_model_path
from promptemb.encoder.template import Template, apply_sentence_rule
from tests.helpers import MINILM

PROMPT = 'This sentence : "[X]" means [MASK] .'


@pytest.fixture(scope="module")
def tokenizer():
    tok = AutoTokenizer.from_pretrained(resolve_model_path(MINILM))
    assert len(tok) == 30522
    return tok


def ids(tokenizer, text):
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def test_layout_matches_whole_string_tokenization(tokenizer):
    builder = InputBuilder(tokenizer, InputForm(Template(PROMPT)), max_length=512)
    sentence = "a man is playing a guitar ."
    item = builder.build([sentence])[0]
    whole = tokenizer(PROMPT.replace("[X]", sentence))["input_ids"]
    assert item.input_ids == whole
    prefix, suffix = ids(tokenizer, 'This sentence : "'), ids(tokenizer, '" means [MASK] .')
    sent = ids(tokenizer, sentence)
    assert item.input_ids == [tokenizer.cls_token_id, *prefix, *sent, *suffix, tokenizer.sep_token_id]
    assert item.roles == [SPECIAL] + [TEMPLATE] * len(prefix) + [SENTENCE] * len(sent) + [TEMPLATE] * len(suffix) + [
        SPECIAL]
    assert item.sentence_length == len(sent)


def test_only_the_sentence_is_truncated(tokenizer):
    form = InputForm(Template(PROMPT), max_sentence_tokens=3)
    item = InputBuilder(tokenizer, form, max_length=512).build(["one two three four five six"])[0]
    assert item.sentence_length == 3
    decoded = tokenizer.decode(item.input_ids)
    assert decoded == '[CLS] this sentence : " one two three " means [MASK]. [SEP]'
    # The model limit also cuts the sentence only: template tokens always survive.
    tight = InputBuilder(tokenizer, InputForm(Template(PROMPT)), max_length=12).build(["a b c d e f g h i j"])[0]
    assert len(tight.input_ids) == 12
    assert tight.input_ids[-5:] == [*ids(tokenizer, '" means [MASK] .'), tokenizer.sep_token_id]


def test_truncation_is_flagged_and_transformers_does_not_warn(tokenizer, capfd):
    tokenizer.deprecation_warnings.clear()  # transformers warns once per tokenizer
    long_sentence = " ".join(["word"] * 600)  # longer than the tokenizer's 512-token model_max_length
    items = InputBuilder(tokenizer, InputForm(Template(PROMPT), max_sentence_tokens=3), max_length=512).build(
        ["one two three", "one two three four", long_sentence])
    assert [item.truncated for item in items] == [False, True, True]
    assert [item.sentence_length for item in items] == [3, 3, 3]
    assert "Token indices sequence length is longer" not in capfd.readouterr().err


def test_plain_form_is_cls_sentence_sep(tokenizer):
    item = InputBuilder(tokenizer, InputForm(), max_length=512).build(["hello world"])[0]
    assert item.input_ids == tokenizer(["hello world"])["input_ids"][0]
    assert item.roles == [SPECIAL, SENTENCE, SENTENCE, SPECIAL]


def test_multi_mask_positions_and_collation(tokenizer):
    template = Template('This sentence : "[X]" means [MASK] [MASK] .')
    assert template.num_masks == 2
    builder = InputBuilder(tokenizer, InputForm(template), max_length=512)
    items = builder.build(["short", "a much longer sentence here"])
    batch = collate(items, tokenizer.pad_token_id, tokenizer.mask_token_id)
    assert batch.input_ids.shape == (2, len(items[1].input_ids))
    for row, item in enumerate(items):
        expected = [i for i, t in enumerate(item.input_ids) if t == tokenizer.mask_token_id]
        assert batch.mask_token[row].nonzero().flatten().tolist() == expected
        assert len(expected) == 2
        assert batch.attention_mask[row].sum().item() == len(item.input_ids)
    assert (batch.roles[0, len(items[0].input_ids):] == PAD).all()


def test_literal_mask_text_in_sentence_is_not_a_mask_position(tokenizer):
    builder = InputBuilder(tokenizer, InputForm(Template(PROMPT)), max_length=512)
    items = builder.build(["what does [MASK] mean"])
    batch = collate(items, tokenizer.pad_token_id, tokenizer.mask_token_id)
    assert batch.mask_token.sum().item() == 1  # only the template's [MASK]


@pytest.mark.parametrize(
    ("rule", "sentence", "expected"),
    [("none", "a cat", "a cat"),
     ("append_period", "a cat", "a cat."),
     ("append_period", "a cat?", "a cat?"),
     ("append_period", 'he said "hi"', 'he said "hi"'),
     # the official PromptBERT evaluation only appends "." (no `"` -> `'`, no final `?` -> `.`)
     ("promptbert", 'he said "hi', 'he said "hi.'),
     ("promptbert", 'he said "hi"', 'he said "hi"'),
     ("promptbert", "it's 'ok'", "it's 'ok'"),
     ("promptbert", "is it?", "is it?"),
     ("promptbert", "a cat", "a cat.")],
)
def test_sentence_rules(rule, sentence, expected):
    assert apply_sentence_rule(sentence, rule) == expected


def test_sentence_rule_applies_to_templated_input_only(tokenizer):
    templated = InputBuilder(tokenizer, InputForm(Template(PROMPT), "append_period"), 512).build(["a cat"])[0]
    plain = InputBuilder(tokenizer, InputForm(None, "append_period"), 512).build(["a cat"])[0]
    assert templated.sentence_length == 3 and plain.sentence_length == 2


@pytest.mark.parametrize("text", ["no slot at all [MASK] .", "[X] and [X] [MASK]"])
def test_template_needs_exactly_one_sentence_slot(text):
    with pytest.raises(ConfigError, match=r"slots; it needs exactly one"):
        Template(text)


def test_mask_required_error():
    with pytest.raises(ConfigError, match=r"needs a \[MASK\]"):
        Template('This sentence : "[X]" .').require_mask("pooler 'mask'")


def test_exported_module_applies_the_same_sentence_rules():
    from promptemb.exporting.st_module import apply_sentence_rule as exported_rule

    sentences = ["a cat", "is it?", 'he said "hi"', 'he said "hi', "it's 'ok'", "end.", ""]
    for rule in ("none", "append_period", "promptbert"):
        assert [exported_rule(s, rule) for s in sentences] == [apply_sentence_rule(s, rule) for s in sentences]
