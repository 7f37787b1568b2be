"""SBERT-WK: dissecting layer-wise token representations (Wang & Kuo, 2020, "SBERT-WK: A Sentence Embedding Method
by Dissecting BERT-based Word Models", Sec. IV, Eq. 9-15), batched over sentences and tokens."""

from __future__ import annotations

import torch

from common.errors import ConfigError
from encoder.outputs import EncoderOutput, normalize_layer
from poolers.base import Needs, Pooler


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


def r_factor(window: torch.Tensor, method: str) -> torch.Tensor:
    """R of the reduced QR of `window`ᵀ, for `window` [..., r, D] (rows = layers).

    `qr`: torch.linalg.qr on the batched [D, r] matrices (Householder, as numpy). `gram`: Cholesky of the r x r Gram
    matrix, which is the same R up to the sign of each row — and every SBERT-WK quantity below is invariant to row
    signs (novelty uses |r_last| and ‖r‖; alignment multiplies row i of R[:-1,:-1] by R[i,-1]) — but avoids
    torch's per-matrix LAPACK loop, which makes it ~100x faster on CPU.
    """
    if method == "qr":
        return torch.linalg.qr(window.transpose(-1, -2), mode="r").R
    return upper_cholesky(window @ window.transpose(-1, -2))


def layer_weights(features: torch.Tensor, window: int, method: str = "gram") -> torch.Tensor:
    """α_k per token: `features` [N, K, D] (K layers) -> [N, K].

    For layer k with window matrix W (rows: window layers, k last) and R = qr(Wᵀ).R, r = R[:, -1]:
    novelty_k = |r_last| / ‖r‖;
    alignment_k = 1 / (mean_col(normalise_cols(R[:-1,:-1])) · R[:-1,-1] / ‖r[:-1]‖ · rows · 2).
    Each is normalised to sum 1 over k, the two are summed and renormalised.
    """
    num_layers = features.shape[-2]
    novelty, alignment = [], []
    for k in range(num_layers):
        rows = window_layers(k, num_layers, window)
        big_r = r_factor(features[..., rows, :], method)
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


def token_variance(features: torch.Tensor) -> torch.Tensor:
    """Variance (ddof 0) of the cosine similarities of adjacent layers (offset-1 diagonal): [N, K, D] -> [N]."""
    unit = torch.nn.functional.normalize(features, dim=-1)
    adjacent = (unit[..., 1:, :] * unit[..., :-1, :]).sum(-1)
    return adjacent.var(dim=-1, unbiased=False)


def sbert_wk_embed(layers: torch.Tensor, tokens: torch.Tensor, window: int = 2, method: str = "gram") -> torch.Tensor:
    """Sentence embeddings from `layers` [B, K, T, D] (the K layers from layer_start to the last) and the boolean
    `tokens` [B, T] that take part; computed in float64 -> [B, D]."""
    features = layers.double().permute(0, 2, 1, 3)  # [B, T, K, D]
    flat = features.reshape(-1, *features.shape[2:])
    selected = tokens.reshape(-1)
    alpha = torch.zeros(flat.shape[:2], dtype=flat.dtype, device=flat.device)
    variance = torch.zeros(flat.shape[0], dtype=flat.dtype, device=flat.device)
    # Padding and excluded tokens are dropped before any QR, so they cannot produce NaNs.
    alpha[selected] = layer_weights(flat[selected], window, method)
    variance[selected] = token_variance(flat[selected])
    unified = (alpha.unsqueeze(-1) * flat).sum(1).view(*features.shape[:2], -1)  # [B, T, D]
    variance = variance.view(tokens.shape)
    weights = variance / variance.sum(-1, keepdim=True)
    return (weights.unsqueeze(-1) * unified).sum(1)


class SBERTWKPooler(Pooler):
    """SBERT-WK with the reference's behaviour (DESIGN.md §3):

    layers k = layer_start..L (hidden_states indices, 0 = embeddings); tokens = all real tokens but the last
    ([CLS] kept, [SEP] dropped); per token, unified word vector v̂_t = Σ_k α_k h^(k)_t (`layer_weights`, Eq. 9-13);
    word weight w_t = Var_k cos(h^(k)_t, h^(k+1)_t) / Σ_t' Var (Eq. 14); e = Σ_t w_t v̂_t (Eq. 15). Plain input.
    """

    def __init__(self, name: str = "sbert_wk", layer_start: int = 4, window: int = 2, method: str = "gram"):
        super().__init__(name)
        if method not in ("gram", "qr"):
            raise ConfigError(f"sbert_wk method {method!r} is unknown; valid: gram, qr")
        if window < 1:
            raise ConfigError(f"sbert_wk window must be >= 1, got {window}")
        self.layer_start, self.window, self.method = int(layer_start), int(window), method

    @property
    def needs(self) -> Needs:
        return Needs(layers_from=self.layer_start)

    def check_model(self, config) -> None:
        num_layers = int(config.num_hidden_layers)
        start = normalize_layer(self.layer_start, num_layers)
        # Word weights are variances of adjacent-layer similarities: 3 layers give the first non-constant one.
        if num_layers - start + 1 < 3:
            raise ConfigError(
                f"sbert_wk needs at least 3 layers from layer_start={self.layer_start} to the last ({num_layers}); "
                f"use pooler_args.sbert_wk.layer_start=<= {num_layers - 2}"
            )

    def arguments(self) -> dict:
        return {"layer_start": self.layer_start, "window": self.window, "method": self.method}

    def __call__(self, out: EncoderOutput) -> torch.Tensor:
        start = normalize_layer(self.layer_start, out.num_layers)
        layers = torch.stack([out.layer(k) for k in range(start, out.num_layers + 1)], dim=1)
        lengths = out.attention_mask.sum(1, keepdim=True)
        positions = torch.arange(out.attention_mask.shape[1], device=lengths.device)
        tokens = positions.unsqueeze(0) < lengths - 1
        return sbert_wk_embed(layers, tokens, self.window, self.method).to(layers.dtype)
