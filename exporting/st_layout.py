"""Which sentence-transformers layout an export gets (`format=auto|native|custom`), and why.

Native (sentence-transformers' own modules, no `trust_remote_code`) when the exported pooling is one
sentence-transformers computes: an encoder's `avg` (mean over every token, [CLS]/[SEP] included) or `cls` (no head)
of the last layer, over the plain sentence (template `[X]`) or over a prefix + the sentence (`query: [X]`: the prefix
is the sentence-transformers prompt), with no sentence rule, soft template or deep prompts. Everything else needs the
custom module (exporting/st_module.py), for the reason `native_modules` names.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from promptemb.common.errors import ConfigError
from promptemb.encoder.outputs import normalize_layer
from promptemb.exporting.st_export import NativeModules

if TYPE_CHECKING:
    from promptemb.inference.prompt_encoder import PromptEncoder

ExportFormat = Literal["auto", "native", "custom"]
#: promptemb's pooler name -> sentence-transformers' Pooling mode computing the same vector
POOLING_MODES = {"avg": "mean", "cls": "cls"}
#: sentences the tokenization check runs: word starts, case, digits, punctuation, outer and inner whitespace, an empty
#: sentence, non-ASCII text; and one longer than any sentence limit (added per model), so truncation is checked too
PROBE_SENTENCES = ("A man is playing a guitar.", "word", "2 dogs, 1 cat!", '"quoted" (text) ?', " leading space",
                   "trailing space ", "two  inner  spaces", "", "naïve café – Ünïcode ☃", "x" * 30)


@dataclass(frozen=True)
class STLayout:
    """What an export's sentence-transformers files are: `native` modules, or None for the custom module; `reason`
    says why, for the record and the model card."""

    format: Literal["native", "custom"]
    reason: str
    native: NativeModules | None = None

    def record(self) -> dict:
        """The `sentence_transformers` entry of the export's `promptemb` block."""
        record = {"format": self.format, "reason": self.reason}
        if self.native is not None:
            record.update(pooling_mode=self.native.pooling_mode, prompt=self.native.prompt,
                          max_seq_length=self.native.max_seq_length)
        return record


def choose_layout(encoder: PromptEncoder, requested: ExportFormat = "auto") -> STLayout:
    """`auto`: native when sentence-transformers can express the pooling, else custom; `native`: native or a
    ConfigError saying why not; `custom`: the custom module."""
    if requested not in typing.get_args(ExportFormat):
        raise ConfigError(f"unknown format={requested}; valid: {', '.join(typing.get_args(ExportFormat))}")
    native, reason = native_modules(encoder)
    if requested == "custom":
        return STLayout("custom", "format=custom was asked for" + ("" if native else f" ({reason})"))
    if native is None:
        if requested == "native":
            raise ConfigError(f"format=native: {reason}; export with format=auto or format=custom (the custom "
                              "module, loaded with trust_remote_code=True)")
        return STLayout("custom", reason)
    return STLayout("native", reason, native)


def native_modules(encoder: PromptEncoder) -> tuple[NativeModules | None, str]:
    """The standard modules that give `encoder`'s embeddings, with what they compute; or None and why there are
    none (the first reason found)."""
    if encoder.pooler_name == "llm2vec":
        return None, ("LLM2Vec runs the decoder with bidirectional attention (the causal mask removed), which "
                      "sentence-transformers' Transformer module does not do")
    if encoder.is_decoder:
        return None, (f"the decoder pools the last token of template {encoder.template.text!r}, whose text after "
                      "the sentence a sentence-transformers prompt (a prefix) cannot hold")
    if encoder.deep_prompt is not None:
        return None, ("DCPCSE's deep prompts (trained keys and values in every layer's self-attention) are not part "
                      "of a standard Transformer module")
    if encoder.soft_template is not None:
        return None, ("OptiPrompt's soft template (trained vectors written into the input embeddings) is not part "
                      "of a standard Transformer module")
    if encoder.pooler_name == "mask":
        what = "the state at the template's [MASK]" + ", minus the template bias" * encoder.denoise
        what += ", through the trained head" * (encoder.head is not None)
        return None, f"[MASK] pooling ({what}) has no sentence-transformers Pooling mode"
    mode = POOLING_MODES.get(encoder.pooler_name)
    if mode is None:
        return None, f"{encoder.pooler_name} pooling has no sentence-transformers Pooling mode"
    if encoder.head is not None:
        return None, f"{encoder.pooler_name} pooling goes through a trained head, which no standard module holds"
    num_layers = int(encoder.transformer.config.num_hidden_layers)
    if normalize_layer(encoder.layer, num_layers) != num_layers:
        return None, (f"{encoder.pooler_name} pools layer {encoder.layer}; sentence-transformers pools the last "
                      "layer's output "
                      f"({num_layers} or -1)")
    if encoder.sentence_rule != "none":
        return None, (f"sentence rule {encoder.sentence_rule!r} changes the sentence before it is embedded; "
                      "sentence-transformers embeds the text as given")
    template = encoder.template
    if template.suffix.strip():
        return None, (f"template {template.text!r} has text after [X]; a sentence-transformers prompt is a prefix "
                      "only")
    if template.prefix and not template.prefix[-1:].isspace():
        return None, (f"template {template.text!r} joins its prefix to the sentence without a space, which a "
                      "tokenizer may merge across; write a space before [X]")
    prompt = template.prefix.rstrip() + " " if template.prefix else ""  # the framework's one space before [X]
    builder = encoder.builder
    native = NativeModules(pooling_mode=mode, prompt=prompt,
                           max_seq_length=2 + len(builder.prefix_ids) + builder.max_sentence_tokens)
    mismatch = tokenization_mismatch(encoder, native)
    if mismatch is not None:
        return None, mismatch
    pooled = ("[CLS] pooling of the last layer of " if mode == "cls" else
              f"{encoder.pooler_name} pooling of the last layer over every token ([CLS]/[SEP] included) of ")
    if prompt:
        return native, (f"{pooled}{prompt!r} + the sentence is sentence-transformers' Pooling('{mode}') with the "
                        "template's prefix as its prompt")
    return native, f"{pooled}the plain sentence is sentence-transformers' Pooling('{mode}')"


def tokenization_mismatch(encoder: PromptEncoder, native: NativeModules) -> str | None:
    """Why sentence-transformers' input (the tokenizer on `prompt + sentence`, truncated to max_seq_length) differs
    from the framework's token-level template on a probe sentence; None when it is the same on all of them."""
    builder, tokenizer = encoder.builder, encoder.tokenizer
    sentences = [*PROBE_SENTENCES, "word " * (builder.max_sentence_tokens + 3)]
    expected = [item.input_ids for item in builder.build(sentences)]
    got = tokenizer([native.prompt + sentence for sentence in sentences], truncation=True,
                    max_length=native.max_seq_length)["input_ids"]
    for sentence, want, have in zip(sentences, expected, got, strict=True):
        if list(have) != list(want):
            return (f"{type(tokenizer).__name__} tokenizes {native.prompt + sentence[:40]!r} into other ids than "
                    "the template's token-level input (prefix ids + sentence ids), which sentence-transformers' "
                    "Transformer module cannot reproduce")
    return None
