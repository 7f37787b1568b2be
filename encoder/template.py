"""Prompt templates such as `This sentence : "[X]" means [MASK] .` and the sentence rules applied before them.

A template is applied at the token level, as PromptBERT's reference code does:
`[CLS] + prefix ids + sentence ids + suffix ids + [SEP]`.
Prefix and suffix are tokenized once; only the sentence is ever truncated.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass
from typing import Literal

from promptemb.common.errors import ConfigError

SENTENCE_SLOT = "[X]"
MASK_SLOT = "[MASK]"

#: Sentence rules, applied to the raw sentence before it fills a template (recorded with every score).
#: `append_period`: add "." unless the sentence ends in . ? " ' (nothing else is changed).
#: `promptbert`: the official PromptBERT evaluation's rule (kongds/Prompt-BERT evaluation.py), which is exactly
#: `append_period`; the name records where the rule comes from.
#: `prompteol`: the rule of the decoder prompt methods' official evaluations (kongds/scaling_sentemb and the code
#: built on it): `append_period`, then every `"` becomes `'` (the templates quote the sentence with `"`), then a
#: final `?` becomes `.`.
#: `moee`: MoEE's official rule (tianyi-lab/MoE-Embedding moee.py `encode`): "." appended unless the sentence ends in
#: . ? ! " ' (`!` included, unlike the others), every `"` becomes `'`, and every `_` becomes a space (the official
#: `.replace('_', ' ')` runs on the filled prompt, sentence included).
SentenceRule = Literal["none", "append_period", "promptbert", "prompteol", "moee"]
SENTENCE_RULES = typing.get_args(SentenceRule)


def apply_sentence_rule(sentence: str, rule: str) -> str:
    if rule == "none":
        return sentence
    if rule not in SENTENCE_RULES:
        raise ConfigError(f"unknown sentence_rule {rule!r}; valid: {', '.join(SENTENCE_RULES)}")
    if rule == "moee":
        if sentence and sentence[-1] not in ".?!\"'":
            sentence += "."
        return sentence.replace('"', "'").replace("_", " ")
    if sentence and sentence[-1] not in ".?\"'":
        sentence += "."
    if rule == "prompteol":
        sentence = sentence.replace('"', "'")
        if sentence.endswith("?"):
            sentence = sentence[:-1] + "."
    return sentence


@dataclass(frozen=True)
class Template:
    """A prompt with exactly one `[X]` (the sentence) and any number of `[MASK]` slots."""

    text: str

    def __post_init__(self) -> None:
        count = self.text.count(SENTENCE_SLOT)
        if count != 1:
            raise ConfigError(
                f"template {self.text!r} has {count} '{SENTENCE_SLOT}' slots; it needs exactly one, "
                f"e.g. 'This sentence : \"{SENTENCE_SLOT}\" means {MASK_SLOT} .'"
            )

    @property
    def prefix(self) -> str:
        return self.text.split(SENTENCE_SLOT)[0]

    @property
    def suffix(self) -> str:
        return self.text.split(SENTENCE_SLOT)[1]

    @property
    def num_masks(self) -> int:
        return self.text.count(MASK_SLOT)

    def require_mask(self, who: str) -> None:
        if self.num_masks == 0:
            raise ConfigError(
                f"{who} needs a [MASK] in the template, but {self.text!r} has none; "
                f"add one, e.g. 'This sentence : \"[X]\" means {MASK_SLOT} .'"
            )
