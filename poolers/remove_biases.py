"""Mean pooling without the tokens that bias BERT embeddings (PromptBERT, Jiang et al. 2022, Sec. 3 / Table 2)."""

from __future__ import annotations

import string
import unicodedata
from collections.abc import Sequence

import torch

from promptemb.common.errors import ConfigError
from promptemb.encoder.outputs import EncoderOutput
from promptemb.poolers.base import Needs, Pooler, masked_mean

#: The 36 most frequent bert-base-uncased tokens of the reference implementation (PromptBERT).
BERT_UNCASED_TOP36 = (
    ".", "a", "the", "in", ",", "is", "to", "of", "and", "'", "on", "man", "-", "s", "with", "for", '"', "at", "##s",
    "woman", "are", "it", "two", "that", "you", "dog", "said", "playing", "i", "an", "as", "was", "from", ":", "by",
    "white",
)


def is_punctuation(token: str) -> bool:
    return bool(token) and all(ch in string.punctuation or unicodedata.category(ch).startswith("P") for ch in token)


def byte_level_decoder(tokenizer):
    """The tokenizer's byte-level BPE decoder (GPT-2, RoBERTa spell each byte as a printable character: space -> `Ġ`,
    the bytes of `é` -> `Ã©`), or None for other tokenizers."""
    decoder = getattr(getattr(tokenizer, "backend_tokenizer", None), "decoder", None)
    return decoder if type(decoder).__name__ == "ByteLevel" else None


def token_text(token: str, byte_level=None) -> str:
    """The text a vocabulary entry spells, without its word-start marker: byte-level tokens decoded (`Ġman` -> `man`,
    `ĠcafÃ©` -> `café`), SentencePiece's `▁` dropped; WordPiece tokens (`##s`) as they are."""
    if byte_level is not None:
        token = byte_level.decode([token])
    return token.strip().removeprefix("▁")


def biased_token(token: str, frequent: frozenset[str], byte_level=None) -> bool:
    """Frequent token, subword piece (`##...`), punctuation-only or whitespace-only, or containing an uppercase
    letter (cased vocabs; an uncased vocab has none). Judged on the token's text (`token_text`): a byte-level
    word-start marker `Ġ` is neither an uppercase letter nor part of the word."""
    text = token_text(token, byte_level)
    return (not text or text in frequent or token.startswith("##") or is_punctuation(text)
            or any(ch.isupper() for ch in text))


class RemoveBiasesPooler(Pooler):
    """e = (1/|K|) Σ_{t∈K} x_t over the kept tokens K of the input (plain, or prompt-templated when `templated`: the
    template words are filtered like sentence words, [MASK] is dropped as special): every real token except the frequent
    list (`frequent_tokens`, default the bert-base-uncased top 36), `##` subword pieces, punctuation-only tokens,
    tokens with uppercase letters, and special tokens ([CLS]/[SEP]/...). Each test reads the token's text, so a
    byte-level BPE token (RoBERTa) is judged without its `Ġ` word-start marker and with its bytes decoded.

    x_t = the static word-embedding row (`variant="static"`, the paper's "static remove biases") or the hidden
    state averaged over `layers` (`variant="contextual"`). A sentence whose tokens are ALL removed (e.g. "a man .")
    falls back to all its non-special tokens rather than a zero vector.
    """

    def __init__(self, name: str = "remove_biases", variant: str = "static", layers: Sequence[int] = (-1,),
                 frequent_tokens: Sequence[str] = BERT_UNCASED_TOP36, templated: bool = False):
        super().__init__(name)
        self.templated = templated
        if variant not in ("static", "contextual"):
            raise ConfigError(f"remove_biases variant {variant!r} is unknown; valid: static, contextual")
        self.variant, self.layers = variant, tuple(layers)
        self.frequent = frozenset(frequent_tokens)
        self.keep_vocab: torch.Tensor | None = None
        self.special_vocab: torch.Tensor | None = None

    @property
    def needs(self) -> Needs:
        if self.variant == "static":
            return Needs(word_embeddings=True, templated=self.templated)
        return Needs(layers=self.layers, templated=self.templated)

    def arguments(self) -> dict:
        return {"variant": self.variant, "frequent_tokens": len(self.frequent)}

    def bind_tokenizer(self, tokenizer) -> None:
        vocab = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
        special = torch.zeros(len(vocab), dtype=torch.bool)
        special[list(tokenizer.all_special_ids)] = True
        byte_level = byte_level_decoder(tokenizer)
        biased = torch.tensor([biased_token(token, self.frequent, byte_level) for token in vocab])
        self.keep_vocab, self.special_vocab = ~(biased | special), special

    def __call__(self, out: EncoderOutput) -> torch.Tensor:
        real = out.attention_mask.bool()
        keep = self.keep_vocab.to(real.device)[out.input_ids] & real
        fallback = ~self.special_vocab.to(real.device)[out.input_ids] & real
        keep = torch.where(keep.any(1, keepdim=True), keep, fallback)
        if self.variant == "static":
            states = out.word_embeddings
        else:
            states = torch.stack([out.layer(k) for k in self.layers]).mean(0)
        return masked_mean(states, keep)
