"""Token-level input construction: templating, truncation, token roles, padding into batches."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from promptemb.common.errors import ConfigError
from promptemb.encoder.decoder_forms import DecoderForm
from promptemb.encoder.template import MASK_SLOT, Template, apply_sentence_rule

# Token roles, one per position: which part of the input a token belongs to. Decoder prompt methods add POOLED
# (the span a span pooler averages or ends at: Echo's second copy and its closing `</s>`) and SLOT (Token
# Prepending's `<PST>` position, whose state is overwritten inside the model).
PAD, SPECIAL, TEMPLATE, SENTENCE, POOLED, SLOT = -1, 0, 1, 2, 3, 4


@dataclass(frozen=True)
class InputForm:
    """How sentences become model inputs. Poolers sharing an InputForm share one forward pass."""

    template: Template | None = None
    sentence_rule: str = "none"
    max_sentence_tokens: int | None = None
    decoder: DecoderForm | None = None  # decoder prompt methods: Echo's template, forward hooks

    def describe(self) -> dict:
        record = {
            "template": self.template.text if self.template else None,
            "sentence_rule": self.sentence_rule if self.template else "none",
            "max_sentence_tokens": self.max_sentence_tokens,
        }
        if self.decoder is not None:
            record["decoder"] = self.decoder.describe()
        return record


@dataclass
class TokenizedInput:
    """One sequence: ids and roles have equal length; `sentence_length` counts sentence tokens after truncation."""

    input_ids: list[int]
    roles: list[int]
    sentence_length: int
    truncated: bool = False  # the sentence had more than max_sentence_tokens tokens and was cut
    auxiliary: TokenizedInput | None = None  # Contrastive Prompting: the same sentence in the auxiliary prompt


class InputBuilder:
    """Builds `[CLS] prefix sentence suffix [SEP]` id sequences for one tokenizer and one InputForm."""

    def __init__(self, tokenizer, form: InputForm, max_length: int):
        if tokenizer.cls_token_id is None or tokenizer.sep_token_id is None:
            raise ConfigError(f"tokenizer {type(tokenizer).__name__} has no [CLS]/[SEP] tokens; use an encoder model")
        self.tokenizer = tokenizer
        self.form = form
        self.prefix_ids: list[int] = []
        self.suffix_ids: list[int] = []
        # A space written between the prefix and [X] belongs to the sentence's first word: byte-level BPE (RoBERTa)
        # makes it part of that token (`Ġword` instead of `word`, as kongds/Prompt-BERT's evaluation tokenizes the
        # filled template), WordPiece ignores it. So it is moved from the prefix to the front of each sentence.
        self.sentence_leading_space = False
        if form.template is not None:
            self.sentence_leading_space = form.template.prefix[-1:].isspace()
            self.prefix_ids = self._tokenize_template_piece(form.template.prefix.rstrip())
            self.suffix_ids = self._tokenize_template_piece(form.template.suffix)
        room = max_length - 2 - len(self.prefix_ids) - len(self.suffix_ids)
        if room < 1:
            raise ConfigError(f"template {form.template.text!r} leaves no room for the sentence in {max_length} tokens")
        self.max_sentence_tokens = min(form.max_sentence_tokens or room, room)
        self._device_ids: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}

    def __getstate__(self) -> dict:  # pickled into tokenizing workers: without tensors of any device
        return {**self.__dict__, "_device_ids": {}}

    def collate(self, items: list[TokenizedInput]) -> Batch:
        return collate(items, self.tokenizer.pad_token_id, self.tokenizer.mask_token_id)

    def _tokenize_template_piece(self, text: str) -> list[int]:
        """Tokenize template text, writing the model's own mask id for each `[MASK]`.

        Text before a mask is right-stripped so byte-level BPE tokenizers (RoBERTa, whose `<mask>` absorbs the space
        before it) give the same ids as tokenizing the whole filled template at once.
        """
        pieces = text.split(MASK_SLOT)
        if len(pieces) > 1 and self.tokenizer.mask_token_id is None:
            raise ConfigError(
                f"the template has {MASK_SLOT} but tokenizer {type(self.tokenizer).__name__} has no mask token; "
                "use a masked-language model (BERT, RoBERTa, ...) or a template without [MASK]"
            )
        ids: list[int] = []
        for index, piece in enumerate(pieces):
            if index < len(pieces) - 1:
                piece = piece.rstrip()
            if piece.strip():
                ids += self.tokenizer(piece, add_special_tokens=False)["input_ids"]
            if index < len(pieces) - 1:
                ids.append(self.tokenizer.mask_token_id)
        return ids

    def tokenize_sentences(self, sentences: list[str]) -> list[list[int]]:
        """The sentence part of each input: the sentence rule applied (templated forms), tokenized without special
        tokens, NOT truncated. `build_from_ids` turns these into the full inputs; datasets store them pre-tokenized."""
        if self.form.template is not None:
            sentences = [apply_sentence_rule(sentence, self.form.sentence_rule) for sentence in sentences]
        if self.sentence_leading_space:
            sentences = [" " + sentence for sentence in sentences]
        # verbose=False: transformers would warn that the untruncated ids exceed the model's length, but only the
        # sentence is cut below (never the template), and the cuts are counted (`truncated`) and reported per task
        return self.tokenizer(sentences, add_special_tokens=False, verbose=False)["input_ids"]

    def build(self, sentences: list[str]) -> list[TokenizedInput]:
        return self.build_from_ids(self.tokenize_sentences(sentences))

    def build_from_ids(self, sentence_ids: list[list[int]]) -> list[TokenizedInput]:
        """Inputs from `tokenize_sentences` ids (or any prefix of them longer than `max_sentence_tokens`)."""
        cls, sep = self.tokenizer.cls_token_id, self.tokenizer.sep_token_id
        prefix_roles, suffix_roles = [TEMPLATE] * len(self.prefix_ids), [TEMPLATE] * len(self.suffix_ids)
        built = []
        for full in sentence_ids:
            ids = list(full[: self.max_sentence_tokens])
            built.append(
                TokenizedInput(
                    input_ids=[cls, *self.prefix_ids, *ids, *self.suffix_ids, sep],
                    roles=[SPECIAL, *prefix_roles, *([SENTENCE] * len(ids)), *suffix_roles, SPECIAL],
                    sentence_length=len(ids),
                    truncated=len(full) > len(ids),
                )
            )
        return built

    def template_ids(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """(prefix ids, suffix ids) as tensors on `device`, made once per device: a tensor built from Python data on
        a GPU is a synchronous host-to-device copy, which the training step must not pay at every batch."""
        cached = self._device_ids.get(device)
        if cached is None:
            cached = self._device_ids[device] = (torch.tensor(self.prefix_ids, dtype=torch.long, device=device),
                                                 torch.tensor(self.suffix_ids, dtype=torch.long, device=device))
        return cached

    def wrap_padded_ids(self, sentence_ids: torch.Tensor, lengths: torch.Tensor,
                        host_lengths: torch.Tensor | None = None) -> Batch:
        """The batch `collate(build_from_ids(rows))` gives, built with tensor ops on the ids' device: `sentence_ids`
        [B, L] holds each row's sentence ids left-aligned (anything after `lengths[b]`), as pre-tokenized data
        loaders deliver them. Template ids are written by offset: [CLS] prefix sentence[:max] suffix [SEP] pad.
        `host_lengths`: the same lengths in host memory (the loader's, before the batch moved to the device): the
        width is read from them instead of from the device."""
        device = sentence_ids.device
        if host_lengths is None:
            host_lengths = lengths.cpu()  # a synchronisation when `lengths` is on an accelerator
        host_n = host_lengths.clamp(max=self.max_sentence_tokens)
        n = lengths.clamp(max=self.max_sentence_tokens).unsqueeze(1)
        prefix, suffix = self.template_ids(device)
        p, s = len(self.prefix_ids), len(self.suffix_ids)
        width = 2 + p + s + int(host_n.max()) if host_n.numel() else 2 + p + s
        pos = torch.arange(width, device=device).expand(sentence_ids.shape[0], width)
        sentence_end = 1 + p + n  # exclusive
        is_prefix = (pos >= 1) & (pos < 1 + p)
        is_sentence = (pos >= 1 + p) & (pos < sentence_end)
        is_suffix = (pos >= sentence_end) & (pos < sentence_end + s)
        is_special = (pos == 0) | (pos == sentence_end + s)
        ids = torch.full_like(pos, self.tokenizer.pad_token_id)
        ids = torch.where(pos == 0, self.tokenizer.cls_token_id, ids)
        ids = torch.where(pos == sentence_end + s, self.tokenizer.sep_token_id, ids)
        if sentence_ids.shape[1]:
            taken = sentence_ids.long().gather(1, (pos - 1 - p).clamp(0, sentence_ids.shape[1] - 1))
            ids = torch.where(is_sentence, taken, ids)
        if p:
            ids = torch.where(is_prefix, prefix[(pos - 1).clamp(0, p - 1)], ids)
        if s:
            ids = torch.where(is_suffix, suffix[(pos - sentence_end).clamp(0, s - 1)], ids)
        roles = torch.full_like(pos, PAD)
        roles = torch.where(is_special, SPECIAL, roles)
        roles = torch.where(is_prefix | is_suffix, TEMPLATE, roles)
        roles = torch.where(is_sentence, SENTENCE, roles)
        batch = _batch(ids, roles, n.squeeze(1), self.tokenizer.mask_token_id)
        batch.host_lengths = host_n
        return batch


@dataclass
class Batch:
    input_ids: torch.Tensor  # [B, T]
    attention_mask: torch.Tensor  # [B, T]
    roles: torch.Tensor  # [B, T], PAD on padding
    mask_token: torch.Tensor  # [B, T] bool, True at [MASK] template positions
    sentence_lengths: torch.Tensor  # [B], sentence tokens after truncation
    position_ids: torch.Tensor | None = None  # [B, T]; None = the model's default positions
    auxiliary: Batch | None = None  # Contrastive Prompting: the auxiliary prompt's batch, row for row
    #: `sentence_lengths` in host memory (CPU), when known without reading the device: the training step plans its
    #: shapes (width, template-bias rows) from them. Stays on the host when the batch moves.
    host_lengths: torch.Tensor | None = None

    def to(self, device: torch.device) -> Batch:
        return Batch(**{name: value if value is None or name == "host_lengths" else value.to(device)
                        for name, value in vars(self).items()})


def collate(items: list[TokenizedInput], pad_id: int, mask_id: int | None) -> Batch:
    width = max(len(item.input_ids) for item in items)
    ids = np.full((len(items), width), pad_id, dtype=np.int64)
    roles = np.full((len(items), width), PAD, dtype=np.int64)
    for row, item in enumerate(items):
        ids[row, : len(item.input_ids)] = item.input_ids
        roles[row, : len(item.roles)] = item.roles
    lengths = torch.tensor([item.sentence_length for item in items], dtype=torch.long)
    batch = _batch(torch.from_numpy(ids), torch.from_numpy(roles), lengths, mask_id)
    batch.host_lengths = lengths
    return batch


def _batch(input_ids: torch.Tensor, roles: torch.Tensor, lengths: torch.Tensor, mask_id: int | None) -> Batch:
    if mask_id is None:
        mask_token = torch.zeros_like(roles, dtype=torch.bool)
    else:
        mask_token = (roles == TEMPLATE) & (input_ids == mask_id)
    return Batch(input_ids=input_ids, attention_mask=(roles != PAD).long(), roles=roles, mask_token=mask_token,
                 sentence_lengths=lengths)
