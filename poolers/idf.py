"""idf-weighted mean pooling over a named corpus."""

from __future__ import annotations

import numpy as np
import torch

from promptemb.encoder.outputs import EncoderOutput
from promptemb.poolers.base import Needs, masked_mean, pooled_tokens, require_template_for
from promptemb.poolers.fitted import CorpusFittedPooler


def document_frequencies(token_ids: list[list[int]], vocab_size: int) -> np.ndarray:
    """df_t = number of sequences containing token t at least once."""
    df = np.zeros(vocab_size, dtype=np.int64)
    for ids in token_ids:
        df[np.unique(np.asarray(ids, dtype=np.int64))] += 1
    return df


class IdfPooler(CorpusFittedPooler):
    """e = Σ_{t∈T} idf(x_t)·h̄_t / Σ_{t∈T} idf(x_t), h̄ = mean of `layers` (idf weighting of Stankevičius &
    Lukoševičius, 2024, "Extracting Sentence Embeddings from Pretrained Transformer Models").

    T = the real tokens of the plain input, or of the prompt-templated input when `templated` (`avg_idf`: the
    paper's "templated avg + idf"), minus the [MASK] tokens when `include_mask` is False.
    idf(v) = log(N / df_v) over the N sentences of the fit corpus, tokenized exactly as the encoder does
    (`[CLS] sentence [SEP]`, never templated), so [CLS]/[SEP] occur in every sentence and get weight 0. A token that
    never occurs in the corpus is treated as occurring once (idf = log N, the rarest weight): on a templated input the
    template words get their corpus idf and [MASK] gets log N. Weights are renormalised per sentence (the division).
    """

    def __init__(self, name: str = "idf", layers: tuple[int, ...] | list[int] = (-1,), corpus: str | None = None,
                 templated: bool = False, include_mask: bool = True):
        super().__init__(name, corpus)
        require_template_for(name, templated, include_mask)
        self.layers = tuple(layers)
        self.templated, self.include_mask = templated, include_mask
        self.idf: torch.Tensor | None = None

    @property
    def needs(self) -> Needs:
        return Needs(layers=self.layers, templated=self.templated, mask_token=not self.include_mask)

    def arguments(self) -> dict:
        return {"include_mask": self.include_mask} if self.templated else {}

    def _fit(self, sentences: list[str], tokenizer) -> None:
        ids = tokenizer(sentences, add_special_tokens=True)["input_ids"]
        df = document_frequencies(ids, len(tokenizer))
        self.idf = torch.from_numpy(np.log(len(ids) / np.maximum(df, 1)))

    def __call__(self, out: EncoderOutput) -> torch.Tensor:
        self.require_fitted()
        states = torch.stack([out.layer(k) for k in self.layers]).mean(0)
        weights = self.idf.to(states.device, states.dtype)[out.input_ids]
        return masked_mean(states, weights * pooled_tokens(out, self.include_mask))
