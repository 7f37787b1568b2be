"""The training forward: every view of a batch and the template biases of its sentence lengths in ONE transformer
call, with no host synchronisation.

Template denoising (PromptBERT §5) subtracts from a sentence of n tokens the [MASK] state of its template alone,
`[CLS] prefix suffix [SEP]`, with the position ids after the prefix shifted by +n (encoder/forward.py
`template_only_batch`, the reference computation). Here those template-only *segments*, one per view and distinct
length, ride along as extra rows of the sentence batch, several segments to a row: a block-diagonal attention mask
keeps each segment to itself and each token carries its own position id, so a segment computes what it computes
alone (BERT-style encoders mix tokens only through attention; position ids, token types, LayerNorm and dropout act
per token). A bias therefore costs its own tokens, not a second call with its fixed per-call cost.

Everything shape-related is planned on the host from the loader's lengths (`Batch.host_lengths`): the width, which
segments exist and where they go. The plan reaches the device as one copy; nothing is read back from it (no
`torch.unique`, no `.item()`), and the number of operators does not depend on how many distinct lengths the batch
holds. The attention mask is handed to the model ready-made (4D), so the model does not inspect a 2D mask either.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from promptemb.encoder.forward import InputEmbedder, position_base, relative_positions_from_ids
from promptemb.encoder.inputs import PAD, SENTENCE, SPECIAL, TEMPLATE, Batch, InputBuilder
from promptemb.encoder.outputs import EncoderOutput, normalize_layer


@dataclass
class BiasRows:
    """Template-only segments packed into rows of the batch's width, on the device.

    `input_ids`, `position_ids`, `roles` and `segments` are [R, T]: `segments` numbers the segments of a row (0, 1,
    ...) and is -1 on padding. `mask_index` [S, M] holds the flat index (row * T + column) of each segment's [MASK]
    tokens, repeated up to the largest mask count M; `mask_weight` [S, M] is 1 for a segment's own masks and 0 for
    the repeats. `row_segment` [N] names, for each sentence row of the batch, the segment whose bias it subtracts."""

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    roles: torch.Tensor
    segments: torch.Tensor
    mask_index: torch.Tensor
    mask_weight: torch.Tensor
    row_segment: torch.Tensor


def _segment_layout(builder: InputBuilder) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(ids, positions before the shift, which positions shift by n, roles, columns of the [MASK] tokens) of the
    template-only segment `[CLS] prefix suffix [SEP]`."""
    tokenizer = builder.tokenizer
    prefix, suffix = builder.prefix_ids, builder.suffix_ids
    ids = np.array([tokenizer.cls_token_id, *prefix, *suffix, tokenizer.sep_token_id], dtype=np.int64)
    positions = np.arange(len(ids), dtype=np.int64)
    shifted = positions > len(prefix)  # suffix and [SEP] sit after the n sentence tokens
    roles = np.array([SPECIAL] + [TEMPLATE] * (len(ids) - 2) + [SPECIAL], dtype=np.int64)
    masks = np.flatnonzero((roles == TEMPLATE) & (ids == tokenizer.mask_token_id))
    return ids, positions, shifted, roles, masks


def bias_rows_needed(builders: Sequence[InputBuilder], width: int) -> list[int]:
    """Rows each view's segments can take at this width: one segment per length a sentence of that view can have
    (0 .. its longest), `width // segment width` segments to a row. Padding every batch's plan to these counts
    (`plan_bias_rows(rows=...)`) gives one shape per width, for a compiled step."""
    needed = []
    for builder in builders:
        segment = 2 + len(builder.prefix_ids) + len(builder.suffix_ids)
        lengths = min(builder.max_sentence_tokens, width - segment) + 1
        needed.append(-(-lengths // (width // segment)))
    return needed


def plan_bias_rows(builders: Sequence[InputBuilder], host_lengths: Sequence[torch.Tensor], width: int, base: int,
                   pad_id: int, device: torch.device, rows: Sequence[int] | None = None) -> BiasRows:
    """The segments of each view's distinct sentence lengths (`host_lengths`, CPU, one per view, in the order of the
    batch's sentence rows), each view's packed `width // segment width` to a row, built on the host and moved to
    `device` in one copy. `rows`: pad each view's rows to this count (filled with more segments of length 0), so
    the shape depends on the width alone."""
    layouts = [_segment_layout(builder) for builder in builders]
    most_masks = max(len(layout[4]) for layout in layouts)
    grids: list[list[np.ndarray]] = [[], [], [], []]  # ids, positions, roles, segments: [rows, width] per view
    mask_index, mask_weight, row_segment = [], [], []
    row_start = segment_start = 0
    for view, ((ids, positions, shifted, roles, masks), lengths) in enumerate(zip(layouts, host_lengths,
                                                                                 strict=True)):
        distinct, inverse = np.unique(np.asarray(lengths, dtype=np.int64), return_inverse=True)
        row_segment.append(segment_start + inverse.reshape(-1))
        per_row = width // len(ids)
        count = -(-len(distinct) // per_row)
        if rows is not None:
            if count > rows[view]:
                raise ValueError(f"view {view}: {len(distinct)} lengths need {count} bias rows, planned {rows[view]}")
            distinct = np.concatenate([distinct, np.zeros(rows[view] * per_row - len(distinct), dtype=np.int64)])
            count = rows[view]
        segment = np.arange(len(distinct))
        row, slot = (segment // per_row)[:, None], (segment % per_row)[:, None]
        columns = slot * len(ids) + np.arange(len(ids))  # [segments, segment width]
        for grid, fill, value in zip(grids, (pad_id, 0, PAD, -1),
                                     (ids, positions + shifted * distinct[:, None] + base, roles, slot), strict=True):
            part = np.full((count, width), fill, dtype=np.int64)
            part[row, columns] = value
            grid.append(part)
        flat = (row_start + row) * width + slot * len(ids) + masks  # [segments, masks of this template]
        mask_index.append(np.concatenate([flat, np.repeat(flat[:, :1], most_masks - len(masks), axis=1)], axis=1))
        weight = np.zeros((len(distinct), most_masks), dtype=np.int64)
        weight[:, : len(masks)] = 1
        mask_weight.append(weight)
        row_start += count
        segment_start += len(distinct)
    pieces = [*(np.concatenate(grid) for grid in grids), np.concatenate(mask_index), np.concatenate(mask_weight),
              np.concatenate(row_segment)]
    moved = _to_device(np.concatenate([piece.reshape(-1) for piece in pieces]), device)
    return BiasRows(*(part.view(piece.shape)
                      for part, piece in zip(moved.split([piece.size for piece in pieces]), pieces, strict=True)))


def plan_pad_bias_rows(builders: Sequence[InputBuilder], host_lengths: Sequence[torch.Tensor], width: int,
                       padding_idx: int | None, pad_id: int, device: torch.device, mask: int | None = None,
                       rows: Sequence[int] | None = None) -> BiasRows:
    """CoT-BERT's template denoising rows: for each view's distinct sentence length n (`host_lengths`, as
    `plan_bias_rows`), the template with n [PAD] tokens in the sentence's place, `[CLS] prefix [PAD]*n suffix [SEP]`,
    every token attended (the [PAD]s too), one segment to a row. Position ids are the model's own for such a row
    (ZBWpro/CoT-BERT passes none): consecutive from 0, or, for embeddings that number positions from the ids
    (`padding_idx`: RoBERTa, MPNet), `padding_idx` on the [PAD]s and padding_idx + 1, 2, ... on the other tokens, so
    there the suffix is not shifted by n. `mask`: which of the template's [MASK]s gives the bias (0 the first, -1 the
    last; None: their mean). `rows`: pad each view's rows to this count with more segments of length 0."""
    layouts = [_segment_layout(builder) for builder in builders]
    chosen = [masks if mask is None else masks[[mask]] for *_, masks in layouts]
    most_masks = max(len(masks) for masks in chosen)
    grids: list[list[np.ndarray]] = [[], [], [], []]  # ids, positions, roles, segments
    mask_index, mask_weight, row_segment = [], [], []
    row_start = segment_start = 0
    for view, ((ids, _, shifted, roles, _), masks, lengths) in enumerate(zip(layouts, chosen, host_lengths,
                                                                             strict=True)):
        distinct, inverse = np.unique(np.asarray(lengths, dtype=np.int64), return_inverse=True)
        row_segment.append(segment_start + inverse.reshape(-1))
        if rows is not None:
            if len(distinct) > rows[view]:
                raise ValueError(f"view {view}: {len(distinct)} lengths need {len(distinct)} bias rows, planned "
                                 f"{rows[view]}")
            distinct = np.concatenate([distinct, np.zeros(rows[view] - len(distinct), dtype=np.int64)])
        split = int(np.argmax(shifted))  # the suffix's first column in the template alone
        part_ids = np.full((len(distinct), width), pad_id, dtype=np.int64)
        part_roles = np.full((len(distinct), width), PAD, dtype=np.int64)
        part_segments = np.full((len(distinct), width), -1, dtype=np.int64)
        for row, n in enumerate(distinct):
            filled = np.concatenate([ids[:split], np.full(n, pad_id, dtype=np.int64), ids[split:]])
            part_ids[row, : len(filled)] = filled
            part_roles[row, : len(filled)] = np.concatenate([roles[:split], np.full(n, SENTENCE), roles[split:]])
            part_segments[row, : len(filled)] = 0
        inside = part_segments == 0
        if padding_idx is None:
            positions = np.where(inside, np.arange(width), 0)
        else:
            counted = inside & (part_ids != padding_idx)
            positions = np.where(counted, np.cumsum(counted, axis=1) + padding_idx, np.where(inside, padding_idx, 0))
        for grid, part in zip(grids, (part_ids, positions, part_roles, part_segments), strict=True):
            grid.append(part)
        columns = masks[None, :] + np.where(masks[None, :] >= split, distinct[:, None], 0)
        flat = (row_start + np.arange(len(distinct)))[:, None] * width + columns
        mask_index.append(np.concatenate([flat, np.repeat(flat[:, :1], most_masks - len(masks), axis=1)], axis=1))
        weight = np.zeros((len(distinct), most_masks), dtype=np.int64)
        weight[:, : len(masks)] = 1
        mask_weight.append(weight)
        row_start += len(distinct)
        segment_start += len(distinct)
    pieces = [*(np.concatenate(grid) for grid in grids), np.concatenate(mask_index), np.concatenate(mask_weight),
              np.concatenate(row_segment)]
    moved = _to_device(np.concatenate([piece.reshape(-1) for piece in pieces]), device)
    return BiasRows(*(part.view(piece.shape)
                      for part, piece in zip(moved.split([piece.size for piece in pieces]), pieces, strict=True)))


def _to_device(host: np.ndarray, device: torch.device) -> torch.Tensor:
    """One host-to-device copy that does not wait for the device (pinned staging memory on CUDA)."""
    tensor = torch.from_numpy(host)
    if device.type == "cuda":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)


def attention_mask_4d(segments: torch.Tensor, implementation: str, dtype: torch.dtype) -> torch.Tensor:
    """[R, 1, T, T] attention mask from segment numbers [R, T] (-1 = padding): a token attends to the real tokens of
    its own segment; a padding position to every real token of its row (what a 2D padding mask lets it do; its
    output is never read). In the form the attention implementation takes: boolean for SDPA, additive for eager."""
    keys = segments.unsqueeze(1)
    queries = segments.unsqueeze(2)
    allowed = ((keys >= 0) & ((queries == keys) | (queries < 0))).unsqueeze(1)
    if implementation == "sdpa":
        return allowed
    if implementation == "eager":
        return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill(~allowed,
                                                                                         torch.finfo(dtype).min)
    raise ValueError(f"the training forward builds attention masks for sdpa and eager attention, not "
                     f"{implementation!r}")


def training_forward(
    transformer: torch.nn.Module,
    batch: Batch,
    layers: tuple[int, ...],
    *,
    bias_rows: BiasRows | None = None,
    input_embedder: InputEmbedder | None = None,
    freeze_bias: bool = False,
    call: Callable[..., object] | None = None,
) -> EncoderOutput:
    """One call of `transformer` (through `call`, e.g. its compiled form, when given) on the sentence rows of `batch`
    and the packed `bias_rows`; the output holds the sentence rows' states of `layers` and, with `bias_rows`, each
    sentence row's template bias (detached under `freeze_bias`: no gradient through it, as computing it without
    gradients). Position ids are explicit (`position_base` + column for sentence rows: the model's own default for
    right-padded rows) and the attention mask is built here, so the model reads nothing back from the device."""
    config = transformer.config
    num_layers = int(config.num_hidden_layers)
    sentence_rows, width = batch.input_ids.shape
    segments = batch.attention_mask.long() - 1  # 0 on real tokens, -1 on padding
    positions = (torch.arange(width, device=batch.input_ids.device) + position_base(transformer)).expand(
        sentence_rows, width)
    input_ids, roles = batch.input_ids, batch.roles
    if bias_rows is not None:
        input_ids = torch.cat([input_ids, bias_rows.input_ids])
        roles = torch.cat([roles, bias_rows.roles])
        segments = torch.cat([segments, bias_rows.segments])
        positions = torch.cat([positions, bias_rows.position_ids])
    dtype = next(transformer.parameters()).dtype
    inputs = {"attention_mask": attention_mask_4d(segments, config._attn_implementation, dtype),
              "position_ids": positions}
    if input_embedder is not None:
        rows = Batch(input_ids=input_ids, attention_mask=segments >= 0, roles=roles,
                     mask_token=torch.zeros_like(roles, dtype=torch.bool), sentence_lengths=batch.sentence_lengths)
        inputs["inputs_embeds"] = input_embedder(rows, transformer.get_input_embeddings())
    else:
        inputs["input_ids"] = input_ids
    wanted = sorted({normalize_layer(layer, num_layers) for layer in layers})
    all_layers = wanted != [num_layers]
    with relative_positions_from_ids(transformer, positions):
        model_out = (transformer if call is None else call)(**inputs, output_hidden_states=all_layers)
    states = {layer: model_out.hidden_states[layer] for layer in wanted} if all_layers else {
        num_layers: model_out.last_hidden_state}
    out = EncoderOutput(num_layers=num_layers, input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                        roles=batch.roles, mask_token=batch.mask_token,
                        hidden_states={layer: value[:sentence_rows] for layer, value in states.items()})
    if bias_rows is not None:
        weight = bias_rows.mask_weight.unsqueeze(-1)
        out.template_bias = {}
        for layer, value in states.items():
            flat = value[sentence_rows:].reshape(-1, value.shape[-1])
            pooled = (flat[bias_rows.mask_index] * weight.to(value.dtype)).sum(1) / weight.sum(1).to(value.dtype)
            bias = pooled[bias_rows.row_segment]
            out.template_bias[layer] = bias.detach() if freeze_bias else bias
    return out
