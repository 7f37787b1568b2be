"""The one transformer call shared by evaluation (`Encoder`, under inference_mode) and training (with gradients).

`run_transformer` turns a `Batch` into the `EncoderOutput` poolers read. It optionally
* writes trainable soft-template vectors into `inputs_embeds` (OptiPrompt), via an `InputEmbedder`;
* computes the template bias of PromptBERT's template denoising for the sentence lengths present in the batch.

Template denoising (PromptBERT §5): for a sentence of n tokens the bias is the hidden state at the [MASK] of the
template alone, `[CLS] prefix suffix [SEP]`, whose position ids after the prefix are shifted by +n so every template
token sits where it sits in the real input. One batched forward covers all distinct n of a batch.
MPNet adds a relative position bias that transformers computes from column indices, not from the position ids
(`MPNetEncoder.compute_position_bias(hidden_states)`): `relative_positions_from_ids` computes it from the ids given, so
the shift moves MPNet's relative distances with its absolute positions (tests/encoder/test_mpnet_positions.py).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol

import torch

from promptemb.encoder.inputs import PAD, SPECIAL, TEMPLATE, Batch, InputBuilder
from promptemb.encoder.outputs import EncoderOutput, normalize_layer
from promptemb.encoder.pooling import Needs


class InputEmbedder(Protocol):
    """Builds `inputs_embeds` [B, T, D] for a batch (e.g. a soft template placed by offset)."""

    def __call__(self, batch: Batch, word_embeddings: torch.nn.Embedding) -> torch.Tensor: ...


def position_base(transformer: torch.nn.Module) -> int:
    """First position id: 0 for BERT; padding_idx + 1 for RoBERTa-style embeddings."""
    padding_idx = getattr(getattr(transformer, "embeddings", None), "padding_idx", None)
    return 0 if padding_idx is None else int(padding_idx) + 1


#: The position ids of the forward each thread runs, for `relative_positions_from_ids`: batches encoded in threads
#: (`Encoder`'s `parallel_batches`) run forwards of the same model at once, some with explicit positions (template
#: biases) and some without.
_THREAD_POSITIONS = threading.local()
#: model encoder (by id) -> forwards in flight that patched its position bias; guarded by `_PATCHING`
_PATCHED: dict[int, int] = {}
_PATCHING = threading.Lock()


@contextmanager
def relative_positions_from_ids(transformer: torch.nn.Module, position_ids: torch.Tensor | None) -> Iterator[None]:
    """While the block runs, an MPNet-style encoder (a `relative_attention_bias` table) computes its relative position
    bias from `position_ids` [B, T] instead of from the columns 0..T-1; nothing changes for other models or without
    position ids. The same values for rows whose ids are consecutive columns (any first id). Thread-safe: the patch
    reads the ids of the thread that calls it, and a forward of another thread without ids gets the model's own
    bias; it is removed when the last forward that needs it ends."""
    encoder = getattr(transformer, "encoder", None)
    table = getattr(encoder, "relative_attention_bias", None)
    if position_ids is None or table is None:
        yield
        return
    buckets = transformer.config.relative_attention_num_buckets
    original = type(encoder).compute_position_bias

    def position_bias(x: torch.Tensor, *args, **kwargs):
        ids = getattr(_THREAD_POSITIONS, "ids", None)
        if ids is None:  # another thread's forward on the default positions
            return original(encoder, x, *args, **kwargs)
        relative = ids[:, None, :] - ids[:, :, None]  # memory - context, as transformers
        values = table(encoder.relative_position_bucket(relative, num_buckets=buckets))  # [B, T, T, H]
        return values.permute(0, 3, 1, 2).contiguous()

    with _PATCHING:
        if not _PATCHED.get(id(encoder)):
            encoder.compute_position_bias = position_bias
        _PATCHED[id(encoder)] = _PATCHED.get(id(encoder), 0) + 1
    outer, _THREAD_POSITIONS.ids = getattr(_THREAD_POSITIONS, "ids", None), position_ids
    try:
        yield
    finally:
        _THREAD_POSITIONS.ids = outer
        with _PATCHING:
            _PATCHED[id(encoder)] -= 1
            if not _PATCHED[id(encoder)]:
                del _PATCHED[id(encoder)], encoder.compute_position_bias


def max_input_length(transformer: torch.nn.Module, tokenizer, requested: int | None = None) -> int:
    """Longest input in tokens: the requested length, capped by the position table (minus the first position id,
    2 for RoBERTa) and by the tokenizer's model_max_length."""
    positions = getattr(transformer.config, "max_position_embeddings", 512) - position_base(transformer)
    return min(requested or positions, positions, tokenizer.model_max_length or positions)


def template_only_batch(builder: InputBuilder, lengths: torch.Tensor, base: int) -> Batch:
    """`[CLS] prefix suffix [SEP]` once per length n, positions after the prefix shifted by +n."""
    prefix, suffix = builder.prefix_ids, builder.suffix_ids
    tokenizer = builder.tokenizer
    ids = [tokenizer.cls_token_id, *prefix, *suffix, tokenizer.sep_token_id]
    width, count = len(ids), len(lengths)
    head = torch.arange(1 + len(prefix), device=lengths.device)
    tail = torch.arange(1 + len(prefix), width, device=lengths.device)
    positions = torch.cat([head.expand(count, -1), tail.unsqueeze(0) + lengths.unsqueeze(1)], dim=1) + base
    # built in host memory and copied without waiting for the device (a tensor made on it from Python data waits)
    input_ids = torch.tensor(ids).to(lengths.device, non_blocking=True).expand(count, -1)
    roles = torch.tensor([SPECIAL] + [TEMPLATE] * (width - 2) + [SPECIAL]).to(
        lengths.device, non_blocking=True).expand(count, -1)
    mask_id = tokenizer.mask_token_id
    return Batch(
        input_ids=input_ids,
        attention_mask=torch.ones_like(input_ids),
        roles=roles,
        mask_token=(roles == TEMPLATE) & (input_ids == mask_id),
        sentence_lengths=torch.zeros_like(lengths),
        position_ids=positions,
    )


def run_transformer(
    transformer: torch.nn.Module,
    batch: Batch,
    needs: Needs,
    *,
    builder: InputBuilder | None = None,
    input_embedder: InputEmbedder | None = None,
    mlm_head: torch.nn.Module | None = None,
    mask_only_when_padded: bool = False,
) -> EncoderOutput:
    """One forward of `transformer` on `batch`, keeping what `needs` asks for (and the template bias if asked).
    `mask_only_when_padded`: a batch without padding is run without an attention mask (the same attention; SDPA
    then takes its unmasked kernels and the model builds no mask), at the price of one look at the mask: for
    evaluation, whose length-sorted batches are mostly unpadded."""
    num_layers = int(transformer.config.num_hidden_layers)
    out = EncoderOutput(num_layers=num_layers, input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                        roles=batch.roles, mask_token=batch.mask_token, mlm_head=mlm_head)
    word_embeddings = transformer.get_input_embeddings()
    if needs.word_embeddings:
        out.word_embeddings = word_embeddings(batch.input_ids)
    layers = {normalize_layer(layer, num_layers) for layer in needs.layers}
    if not layers and not needs.attentions:
        return out
    # never without a mask when positions are explicit: from transformers 5.25 on, an encoder given position ids and
    # no mask reads each jump in them (the template bias rows' +n) as the start of another packed sequence
    unpadded = (mask_only_when_padded and not needs.attentions and batch.position_ids is None
                and bool(batch.attention_mask.all()))
    inputs = {"attention_mask": None if unpadded else batch.attention_mask, "position_ids": batch.position_ids}
    if input_embedder is not None:
        inputs["inputs_embeds"] = input_embedder(batch, word_embeddings)
    else:
        inputs["input_ids"] = batch.input_ids
    all_layers = layers != {num_layers}
    with relative_positions_from_ids(transformer, batch.position_ids):
        model_out = transformer(**inputs, output_hidden_states=all_layers, output_attentions=needs.attentions)
    if all_layers:
        out.hidden_states = {layer: model_out.hidden_states[layer] for layer in layers}
    else:
        out.hidden_states = {num_layers: model_out.last_hidden_state}
    out.attentions = model_out.attentions if needs.attentions else None
    if needs.template_bias:
        out.template_bias = template_bias(transformer, builder, batch.sentence_lengths, needs.layers,
                                          input_embedder=input_embedder)
    return out


def template_bias(
    transformer: torch.nn.Module,
    builder: InputBuilder,
    sentence_lengths: torch.Tensor,
    layers: tuple[int, ...] = (-1,),
    *,
    input_embedder: InputEmbedder | None = None,
) -> dict[int, torch.Tensor]:
    """Per row, the [MASK] state (averaged over several masks) of the template alone at that row's length.

    Returns normalised layer -> [B, D]; computed once per distinct length, same train/eval and grad state as the
    caller, so gradients flow through the bias unless the caller wraps this in `torch.no_grad()`.
    """
    return template_biases(transformer, [builder], [sentence_lengths], layers, input_embedder=input_embedder)[0]


def template_biases(
    transformer: torch.nn.Module,
    builders: list[InputBuilder],
    sentence_lengths: list[torch.Tensor],
    layers: tuple[int, ...] = (-1,),
    *,
    input_embedder: InputEmbedder | None = None,
) -> list[dict[int, torch.Tensor]]:
    """`template_bias` for several templates at once: all their template-only rows in ONE forward (rows padded to
    the widest template), so a two-view step pays the fixed cost of a forward once, not twice."""
    base = position_base(transformer)
    device = next(transformer.parameters()).device
    parts, inverses = [], []
    for builder, lengths in zip(builders, sentence_lengths, strict=True):
        # lengths in host memory (the training step's) are made unique there, without reading the device
        unique, inverse = torch.unique(lengths, return_inverse=True)
        parts.append(template_only_batch(builder, unique.to(device, non_blocking=True), base))
        inverses.append(inverse.to(device, non_blocking=True))
    batch = concat_batches(parts, builders[0].tokenizer.pad_token_id)
    bias_out = run_transformer(transformer, batch, Needs(layers=tuple(layers)), input_embedder=input_embedder)
    weights = batch.mask_token.to(next(iter(bias_out.hidden_states.values())).dtype).unsqueeze(-1)
    pooled = {layer: (states * weights).sum(1) / weights.sum(1) for layer, states in bias_out.hidden_states.items()}
    results, start = [], 0
    for part, inverse in zip(parts, inverses, strict=True):
        rows = slice(start, start + part.input_ids.shape[0])
        results.append({layer: states[rows][inverse] for layer, states in pooled.items()})
        start = rows.stop
    return results


def concat_batches(batches: list[Batch], pad_id: int, width: int | None = None) -> Batch:
    """Stack batches row-wise, right-padding narrower ones (padding is masked out of attention) to the widest one,
    or to `width`."""
    widest = max(b.input_ids.shape[1] for b in batches)
    if width is not None and width < widest:
        raise ValueError(f"cannot pad batches of width {widest} to {width}")
    width = width or widest
    if len(batches) == 1 and batches[0].input_ids.shape[1] == width:
        return batches[0]

    def pad(tensor: torch.Tensor, value) -> torch.Tensor:
        return torch.nn.functional.pad(tensor, (0, width - tensor.shape[1]), value=value)

    # None = the model's default positions; explicit ones (template-only rows) cannot mix with them
    positions = [b.position_ids for b in batches]
    if all(p is None for p in positions):
        positions = None
    elif any(p is None for p in positions):
        raise ValueError("cannot concatenate batches with and without explicit position ids")

    return Batch(
        input_ids=torch.cat([pad(b.input_ids, pad_id) for b in batches]),
        attention_mask=torch.cat([pad(b.attention_mask, 0) for b in batches]),
        roles=torch.cat([pad(b.roles, PAD) for b in batches]),
        mask_token=torch.cat([pad(b.mask_token, False) for b in batches]),
        sentence_lengths=torch.cat([b.sentence_lengths for b in batches]),
        position_ids=None if positions is None else torch.cat([pad(b, 0) for b in positions]),
    )
