"""The "Avg." static model (each token's hidden state averaged over its occurrences in a named corpus) and BERT+Avg.
(the contextual mean mixed with it) of Stankevičius & Lukoševičius, 2024, "Extracting Sentence Embeddings from
Pretrained Transformer Models"."""

from __future__ import annotations

import hashlib
import weakref
from collections.abc import Sequence

import torch

from promptemb.common.errors import ConfigError
from promptemb.data.fit_corpora import TARGET
from promptemb.encoder.inputs import InputForm, collate
from promptemb.encoder.outputs import EncoderOutput
from promptemb.poolers.base import Needs, masked_mean
from promptemb.poolers.fitted import CorpusFittedPooler


def token_state_table(encoder, sentences: Sequence[str], layers: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(A [V, D] float64, counts [V]): A[v] = mean of h̄_t over every occurrence t of token v in `sentences`, each
    encoded alone as `[CLS] sentence [SEP]` by `encoder`'s own forward pass; h̄ = the mean of `layers`. Rows of
    tokens that never occur are 0 with count 0."""
    builder = encoder.input_builder(InputForm())
    items = builder.build(list(sentences))
    needs = Needs(layers=tuple(layers))
    sums = torch.zeros(len(encoder.tokenizer), encoder.hidden_size, dtype=torch.float64)
    counts = torch.zeros(len(encoder.tokenizer), dtype=torch.long)
    order = sorted(range(len(items)), key=lambda i: -len(items[i].input_ids))
    for start in range(0, len(items), encoder.batch_size):
        batch = collate([items[i] for i in order[start : start + encoder.batch_size]],
                        encoder.tokenizer.pad_token_id, encoder.tokenizer.mask_token_id)
        with torch.inference_mode():
            out = encoder.forward(batch, needs)
            states = torch.stack([out.layer(k) for k in layers]).mean(0).double().cpu()
        real = batch.attention_mask.bool()
        ids = batch.input_ids[real]
        sums.index_add_(0, ids, states[real])
        counts.index_add_(0, ids, torch.ones_like(ids))
    return sums / counts.clamp_min(1).unsqueeze(1), counts


#: encoder -> {(layers, corpus digest): table}: `token_avg` and `bert_token_avg` on one corpus share one fit pass
_TABLES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def cached_token_state_table(encoder, sentences: Sequence[str], layers: Sequence[int]):
    digest = hashlib.sha256("\n".join(sentences).encode("utf-8")).hexdigest()
    tables = _TABLES.setdefault(encoder, {})
    key = (tuple(layers), digest)
    if key not in tables:
        tables[key] = token_state_table(encoder, sentences, layers)
    return tables[key]


class TokenAveragePooler(CorpusFittedPooler):
    """Avg.: e_avg = (1/|S|) Σ_{t∈S} A[x_t]; BERT+Avg. (`weight` w): e = (1 − w)·e_mean + w·e_avg.

    A[v] = the hidden state of token v (mean of `layers`) averaged over all its occurrences in the fit corpus
    (`token_state_table`): a static, context-free vector per vocabulary token distilled from the contextual model.
    S = the real tokens of the plain input that occur in the corpus ([CLS]/[SEP] included); a sentence with none gets
    the zero vector. e_mean = the mean pooler at the same `layers` (MeanPooler's formula). `weight=None` (the
    `token_avg` pooler) is Avg. alone and runs no transformer layer at embedding time; `bert_token_avg` defaults to
    w = 0.5. The corpus must be named: the table is one vocabulary-wide fit, not per task.
    """

    def __init__(self, name: str = "token_avg", layers: Sequence[int] = (-1,), corpus: str | None = None,
                 weight: float | None = None):
        super().__init__(name, corpus)
        if corpus is None or corpus == TARGET:
            raise ConfigError(
                f"pooler {name!r} needs a named corpus whose token occurrences define the static vectors: "
                f"pooler_args.{name}.corpus=W|stsb_train|file:PATH"
            )
        if weight is not None and not 0.0 <= weight <= 1.0:
            raise ConfigError(f"pooler {name!r}: weight must be in [0, 1], got {weight}")
        self.layers, self.weight = tuple(layers), weight
        self.encoder = None
        self.table: torch.Tensor | None = None
        self.seen: torch.Tensor | None = None

    @property
    def needs(self) -> Needs:
        return Needs() if self.weight is None else Needs(layers=self.layers)

    def bind_encoder(self, encoder) -> None:
        self.encoder = encoder

    def arguments(self) -> dict:
        return {"table_layers": list(self.layers), "weight": self.weight,
                "vocabulary_seen": None if self.seen is None else int(self.seen.sum())}

    def _fit(self, sentences: list[str], tokenizer) -> None:
        if self.encoder is None:
            raise ConfigError(f"pooler {self.name!r} must be bound to an encoder before fitting "
                              "(Encoder.check_poolers does this)")
        table, counts = cached_token_state_table(self.encoder, sentences, self.layers)
        self.table, self.seen = table.float(), counts > 0

    def __call__(self, out: EncoderOutput) -> torch.Tensor:
        self.require_fitted()
        device = out.input_ids.device
        seen = self.seen.to(device)[out.input_ids] & out.attention_mask.bool()
        static = masked_mean(self.table.to(device)[out.input_ids], seen)
        if self.weight is None:
            return static
        states = torch.stack([out.layer(k) for k in self.layers]).mean(0)
        contextual = masked_mean(states, out.attention_mask)
        return (1.0 - self.weight) * contextual + self.weight * static.to(contextual.dtype)
