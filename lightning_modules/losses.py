"""InfoNCE over the global batch: embeddings gathered from every rank, the local slice kept differentiable."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F


def world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def gather_with_grad(local: torch.Tensor) -> torch.Tensor:
    """Concatenate `local` [b, D] from all ranks in rank order; this rank's slice is `local` itself (with grad).

    Every rank must pass the same b (the data modules drop the last incomplete batch).
    """
    if world_size() == 1:
        return local
    parts = [torch.empty_like(local) for _ in range(world_size())]
    dist.all_gather(parts, local.detach().contiguous())
    parts[dist.get_rank()] = local
    return torch.cat(parts)


def info_nce(
    anchors: torch.Tensor,
    positives: torch.Tensor,
    temperature: float = 0.05,
    hard_negatives: torch.Tensor | None = None,
) -> torch.Tensor:
    """L = -(1/N) Σ_i log [ e^{cos(a_i, p_i)/τ} / ( Σ_j e^{cos(a_i, p_j)/τ} + Σ_j e^{cos(a_i, n_j)/τ} ) ]

    (SimCSE Eq. 1 / Eq. 5; PromptBERT Eq. 4 with h = denoised [MASK] states). i and j run over the GLOBAL batch of
    N = Σ_ranks b rows: every rank computes the same value, the one a single process would on the joined batch.
    Gradients reach this rank's parameters only through its own slice, so the caller scales the loss it
    back-propagates by the world size (DDP averages gradients) to get exactly the single-process gradient.
    """
    a, p = gather_with_grad(anchors), gather_with_grad(positives)
    columns = p if hard_negatives is None else torch.cat([p, gather_with_grad(hard_negatives)])
    # Normalisation, similarities and softmax in fp32 even under bf16/fp16 autocast: cos/τ reaches 1/τ = 20, where
    # bf16 steps by 0.125, and a near-converged loss is a sum of exp(logit differences) that such steps distort.
    with torch.autocast(device_type=a.device.type, enabled=False):
        logits = F.normalize(a.float(), dim=-1) @ F.normalize(columns.float(), dim=-1).T / temperature
        labels = torch.arange(a.shape[0], device=a.device)
        return F.cross_entropy(logits, labels)
