"""idf-weighted mean pooling over a named corpus."""

from __future__ import annotations

import numpy as np
import torch

from encoder.outputs import EncoderOutput
from poolers.base import Needs, masked_mean
from poolers.fitted import CorpusFittedPooler


def document_frequencies(token_ids: list[list[int]], vocab_size: int) -> np.ndarray:
    """df_t = number of sequences containing token t at least once."""
    df = np.zeros(vocab_size, dtype=np.int64)
    for ids in token_ids:
        df[np.unique(np.asarray(ids, dtype=np.int64))] += 1
    return df


class IdfPooler(CorpusFittedPooler):
    """e = Σ_t idf(x_t)·h̄_t / Σ_t idf(x_t) over the real tokens of the plain input, h̄ = mean of `layers`.

    idf(v) = log(N / df_v) over the N sentences of the fit corpus, tokenized exactly as the encoder does
    (`[CLS] sentence [SEP]`), so [CLS]/[SEP] occur in every sentence and get weight 0. A token that never occurs
    in the corpus is treated as occurring once (idf = log N, the rarest weight). Weights are renormalised per
    sentence (the division above).
    """

    def __init__(self, name: str = "idf", layers: tuple[int, ...] | list[int] = (-1,), corpus: str | None = None):
        super().__init__(name, corpus)
        self.layers = tuple(layers)
        self.idf: torch.Tensor | None = None

    @property
    def needs(self) -> Needs:
        return Needs(layers=self.layers)

    def _fit(self, sentences: list[str], tokenizer) -> None:
        ids = tokenizer(sentences, add_special_tokens=True)["input_ids"]
        df = document_frequencies(ids, len(tokenizer))
        self.idf = torch.from_numpy(np.log(len(ids) / np.maximum(df, 1)))

    def __call__(self, out: EncoderOutput) -> torch.Tensor:
        self.require_fitted()
        states = torch.stack([out.layer(k) for k in self.layers]).mean(0)
        weights = self.idf.to(states.device, states.dtype)[out.input_ids]
        return masked_mean(states, weights * out.attention_mask)
