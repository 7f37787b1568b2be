"""SBERT-WK: dissecting layer-wise token representations (Wang & Kuo, 2020, "SBERT-WK: A Sentence Embedding Method
by Dissecting BERT-based Word Models", Sec. IV, Eq. 9-15), batched over sentences and tokens."""

from __future__ import annotations

from collections.abc import Callable

import torch

from promptemb.common.errors import ConfigError
from promptemb.encoder.outputs import EncoderOutput, normalize_layer
from promptemb.poolers.base import Needs, Pooler


def window_layers(k: int, num_layers: int, window: int) -> list[int]:
    """Layer positions stacked for layer k: left window, right window, then k last.

    Emulates the reference's Python slicing `feature[k-m:k]`: for k < m the negative start makes the whole left
    window empty (it is not clipped to 0); the right window is clipped at the last layer.
    """
    positions = list(range(num_layers))
    return [*positions[k - window : k], *positions[k + 1 : k + window + 1], k]


def upper_cholesky(gram: torch.Tensor) -> torch.Tensor:
    """R (upper triangular, positive diagonal) with RᵀR = gram, batched over leading axes; r x r is tiny (≤ 2m+1),
    so the loop runs over matrix columns only, each step vectorised over every token."""
    r = gram.shape[-1]
    factor = torch.zeros_like(gram)
    for j in range(r):
        above = factor[..., :j, j:]  # rows < j, columns >= j
        residual = gram[..., j, j:] - (above[..., :, :1] * above).sum(-2)
        pivot = residual[..., :1].clamp_min(torch.finfo(gram.dtype).tiny).sqrt()
        factor[..., j, j:] = torch.cat([pivot, residual[..., 1:] / pivot], dim=-1)
    return factor


def r_factors(layers: torch.Tensor, gram: torch.Tensor, method: str) -> Callable[[list[int]], torch.Tensor]:
    """rows -> R of the reduced QR of Wᵀ, W = the window matrix of those layer rows, for every token at once.

    `qr`: torch.linalg.qr on the batched [D, r] matrices (Householder, as numpy). `gram` (default): Cholesky of the
    r x r sub-matrix of the token's layer Gram matrix, which is the same R up to the sign of each row — and every
    SBERT-WK quantity is invariant to row signs (novelty uses |r_last| and ‖r‖; alignment multiplies row i of
    R[:-1,:-1] by R[i,-1]). It needs one Gram product for all layers instead of a LAPACK call per token and layer.
    """
    if method == "qr":
        def by_qr(rows: list[int]) -> torch.Tensor:
            index = torch.tensor(rows, device=layers.device)
            return torch.linalg.qr(layers.index_select(-2, index).transpose(-1, -2), mode="r").R

        return by_qr

    def by_gram(rows: list[int]) -> torch.Tensor:
        index = torch.tensor(rows, device=gram.device)
        return upper_cholesky(gram.index_select(-2, index).index_select(-1, index))

    return by_gram


def layer_weights(r_of: Callable[[list[int]], torch.Tensor], num_layers: int, window: int) -> torch.Tensor:
    """α_k per token -> [..., K], given `r_of(rows)` = R factors [..., r, r] of the window matrices.

    For layer k with window matrix W (rows: window layers, k last) and R = qr(Wᵀ).R, r = R[:, -1]:
    novelty_k = |r_last| / ‖r‖;
    alignment_k = 1 / (mean_col(normalise_cols(R[:-1,:-1])) · R[:-1,-1] / ‖r[:-1]‖ · rows · 2).
    Each is normalised to sum 1 over k, the two are summed and renormalised.
    """
    novelty, alignment = [], []
    for k in range(num_layers):
        rows = window_layers(k, num_layers, window)
        big_r = r_of(rows)
        r = big_r[..., :, -1]
        novelty.append(r[..., -1].abs() / r.norm(dim=-1))
        top = big_r[..., :-1, :-1]
        norms = top.norm(dim=-2, keepdim=True)
        unit = top / torch.where(norms == 0, torch.ones_like(norms), norms)  # sklearn normalize leaves 0 columns
        cosine = (unit.mean(-1) * big_r[..., :-1, -1]).sum(-1) / r[..., :-1].norm(dim=-1)
        alignment.append(1.0 / (cosine * len(rows) * 2))
    novelty_t, alignment_t = torch.stack(novelty, -1), torch.stack(alignment, -1)
    alpha = novelty_t / novelty_t.sum(-1, keepdim=True) + alignment_t / alignment_t.sum(-1, keepdim=True)
    return alpha / alpha.sum(-1, keepdim=True)


def adjacent_cosine_variance(gram: torch.Tensor) -> torch.Tensor:
    """Variance (ddof 0) over k of cos(h^(k), h^(k+1)) (the offset-1 diagonal of the layer cosine matrix), from the
    Gram matrices [..., K, K] -> [...]."""
    norms = gram.diagonal(dim1=-2, dim2=-1).clamp_min(0).sqrt()
    adjacent = gram.diagonal(offset=1, dim1=-2, dim2=-1) / (norms[..., 1:] * norms[..., :-1]).clamp_min(1e-300)
    return adjacent.var(dim=-1, unbiased=False)


def sbert_wk_embed(layers: torch.Tensor, tokens: torch.Tensor, window: int = 2, method: str = "gram") -> torch.Tensor:
    """Sentence embeddings from `layers` [B, T, K, D] (per token, the K layers from layer_start to the last) and the
    boolean `tokens` [B, T] that take part; float64, all tokens at once, no copies of `layers` -> [B, D]."""
    layers = layers.double()
    gram = layers @ layers.transpose(-1, -2)  # [B, T, K, K]: all that the weights depend on
    alpha = layer_weights(r_factors(layers, gram, method), layers.shape[2], window)  # [B, T, K]
    unified = (torch.where(tokens.unsqueeze(-1), alpha, 0.0).unsqueeze(-2) @ layers).squeeze(-2)  # [B, T, D]
    # Excluded tokens ([SEP], padding) may give NaN weights; `where` drops them before they can spread.
    variance = torch.where(tokens, adjacent_cosine_variance(gram), 0.0)
    weights = variance / variance.sum(-1, keepdim=True)
    return (weights.unsqueeze(-2) @ unified).squeeze(-2)


class SBERTWKPooler(Pooler):
    """e = Σ_t w_t v̂_t with v̂_t = Σ_k α_k h^(k)_t (SBERT-WK, Eq. 9-15), as the reference implementation computes it.

    Layers k = layer_start..L (hidden_states indices, 0 = embeddings); tokens = all real tokens but the last
    ([CLS] kept, [SEP] dropped); per token, unified word vector v̂_t = Σ_k α_k h^(k)_t (`layer_weights`, Eq. 9-13);
    word weight w_t = Var_k cos(h^(k)_t, h^(k+1)_t) / Σ_t' Var (Eq. 14); e = Σ_t w_t v̂_t (Eq. 15). Plain input, or
    the prompt-templated input (template and [MASK] tokens weighted like sentence tokens) when `templated`.
    """

    def __init__(self, name: str = "sbert_wk", layer_start: int = 4, window: int = 2, method: str = "gram",
                 templated: bool = False):
        super().__init__(name)
        self.templated = templated
        if method not in ("gram", "qr"):
            raise ConfigError(f"sbert_wk method {method!r} is unknown; valid: gram, qr")
        if window < 1:
            raise ConfigError(f"sbert_wk window must be >= 1, got {window}")
        self.layer_start, self.window, self.method = int(layer_start), int(window), method

    @property
    def needs(self) -> Needs:
        return Needs(layers_from=self.layer_start, templated=self.templated)

    def check_model(self, config) -> None:
        num_layers = int(config.num_hidden_layers)
        start = normalize_layer(self.layer_start, num_layers)
        # Word weights are variances of adjacent-layer similarities: 3 layers give the first non-constant one.
        if num_layers - start + 1 < 3:
            raise ConfigError(
                f"sbert_wk needs at least 3 layers from layer_start={self.layer_start} to the last ({num_layers}); "
                f"use pooler_args.sbert_wk.layer_start=<= {num_layers - 2}"
            )
        count = num_layers - start + 1
        lonely = [k for k in range(count) if len(window_layers(k, count, self.window)) == 1]
        if lonely:  # the reference's QR then has no neighbour rows (it crashes); ours would give NaN weights
            raise ConfigError(
                f"sbert_wk window={self.window} leaves layer {start + lonely[0]} with no neighbouring layer among "
                f"the {count} layers from layer_start={self.layer_start} (the reference's slicing); use another "
                "pooler_args.sbert_wk.window"
            )

    def arguments(self) -> dict:
        return {"layer_start": self.layer_start, "window": self.window, "method": self.method}

    def __call__(self, out: EncoderOutput) -> torch.Tensor:
        start = normalize_layer(self.layer_start, out.num_layers)
        layers = torch.stack([out.layer(k) for k in range(start, out.num_layers + 1)], dim=2)  # [B, T, K, D]
        lengths = out.attention_mask.sum(1, keepdim=True)
        positions = torch.arange(out.attention_mask.shape[1], device=lengths.device)
        tokens = positions.unsqueeze(0) < lengths - 1
        return sbert_wk_embed(layers, tokens, self.window, self.method).to(layers.dtype)
