"""Bidirectional attention for decoder LLMs (LLM2Vec, BehnamGhader et al. 2024): the causal mask removed, so every
token attends to every real (non-padding) token of its row.

The official code (McGill-NLP/llm2vec 0.2.3, `llm2vec/models/bidirectional_*.py`) subclasses each family's model
with attention modules whose `is_causal` is False and a `_update_causal_mask` that keeps only the padding columns
(a key that is padding is masked for every query, padded query rows included). In transformers 5 the same mask is
`masking_utils.create_bidirectional_mask` (the padding mask of the model's attention implementation, eager's additive
float or sdpa's boolean); a prepared 4D mask is used as-is by every family's `create_causal_mask`, and the forward
keyword `is_causal=False` reaches the attention functions, so the unmodified model runs bidirectionally for one call
without changing its modules or its config (thread-safe: concurrent causal forwards are unaffected).
"""

from __future__ import annotations

import torch

from promptemb.common.errors import ConfigError

#: transformers model types whose bidirectional variant the official code ships and that are tested equal to it
#: (`gemma` is Gemma 1, the official GemmaBiModel; Gemma 2 is another model type, without an official variant)
BIDIRECTIONAL_FAMILIES = ("llama", "mistral", "qwen2", "gemma")
#: attention implementations whose mask is the 4D tensor built here (flash attention takes no 4D mask)
BIDIRECTIONAL_ATTENTION = ("eager", "sdpa")


def check_bidirectional_family(who: str, config) -> None:
    """Refuse, from the model's config alone, a model the bidirectional forward is not defined for."""
    model_type = getattr(config, "model_type", type(config).__name__)
    if model_type not in BIDIRECTIONAL_FAMILIES:
        raise ConfigError(f"{who} needs bidirectional attention, which runs on {', '.join(BIDIRECTIONAL_FAMILIES)} "
                          f"decoders (as the official LLM2Vec code), but the model is {model_type!r}")
    implementation = getattr(config, "_attn_implementation", None) or "sdpa"
    if implementation not in BIDIRECTIONAL_ATTENTION:
        raise ConfigError(f"{who} needs bidirectional attention, which runs with attn_implementation "
                          f"{' or '.join(BIDIRECTIONAL_ATTENTION)}, not {implementation!r}")


def bidirectional_arguments(transformer: torch.nn.Module, attention_mask: torch.Tensor) -> dict:
    """The forward keywords that make one call of `transformer` (a LLaMA/Mistral/Qwen2/Gemma base model or causal LM)
    bidirectional: the padding-only 4D mask for its attention implementation and `is_causal=False`."""
    from transformers.masking_utils import create_bidirectional_mask

    config = transformer.config
    shape = (*attention_mask.shape, 0)  # only its batch size, length, dtype and device are read
    stub = torch.empty(shape, dtype=transformer.dtype, device=attention_mask.device)
    mask = create_bidirectional_mask(config, stub, attention_mask, allow_is_bidirectional_skip=False)
    return {"attention_mask": mask, "is_causal": False}
