"""The Random Embeddings baseline: a fixed random vector per vocabulary token, averaged over the sentence."""

from __future__ import annotations

import torch

from promptemb.common.errors import ConfigError
from promptemb.encoder.outputs import EncoderOutput
from promptemb.poolers.base import Needs, Pooler, masked_mean


class RandomEmbeddingPooler(Pooler):
    """e = (1/|T|) Σ_{t∈T} R[x_t], R ∈ ℝ^{V×D} with i.i.d. N(0, 1) entries drawn once from `seed` (the
    "Random Embeddings" baseline of Stankevičius & Lukoševičius, 2024, "Extracting Sentence Embeddings from Pretrained
    Transformer Models": what a bag of tokens scores with no learned geometry at all).

    T = every non-padding token of the plain input ([CLS]/[SEP] included, as `static`); V = the tokenizer's vocabulary;
    D = `dim`, default the model's hidden size. No transformer layer runs.
    """

    def __init__(self, name: str = "random", seed: int = 0, dim: int | None = None):
        super().__init__(name)
        if dim is not None and dim < 1:
            raise ConfigError(f"random dim must be >= 1 or null, got {dim}")
        self.seed, self.dim = int(seed), dim
        self.hidden_size: int | None = None
        self.table: torch.Tensor | None = None

    @property
    def needs(self) -> Needs:
        return Needs()

    def check_model(self, config) -> None:
        # the default width is the model's, so the baseline is compared at equal dimension
        self.hidden_size = int(config.hidden_size)

    def bind_tokenizer(self, tokenizer) -> None:
        generator = torch.Generator().manual_seed(self.seed)
        self.table = torch.randn(len(tokenizer), self.dim or self.hidden_size, generator=generator)

    def arguments(self) -> dict:
        return {"seed": self.seed, "dim": self.dim or self.hidden_size}

    def __call__(self, out: EncoderOutput) -> torch.Tensor:
        return masked_mean(self.table.to(out.input_ids.device)[out.input_ids], out.attention_mask)
