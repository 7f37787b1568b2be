"""A plain re-implementation of DCPCSE's official computation, for the exactness tests (tests/lightning_modules/
test_dcpcse.py). It follows YJiangcm/DCPCSE at commit 4b319380fa13d018811dd0631bcbeee838c3218e, promcse/models.py
(`PrefixEncoder`, `BertForCL.get_prompt` / `RobertaForCL.get_prompt`, `cl_forward`, `sentemb_forward`, `MLPLayer`,
`Similarity`, the energy-based hinge loss), on the transformers the official code pins (requirements.txt:
transformers==4.2.1): `BertModel.forward` / `RobertaModel.forward` with `past_key_values`, written out with an
explicit attention computation:

* `past_key_values_length = past_key_values[0][0].shape[2]` (modeling_bert.py l. 922), handed to the embeddings:
  BERT's `position_ids = self.position_ids[:, past_key_values_length : seq_length + past_key_values_length]`
  (l. 194), RoBERTa's `create_position_ids_from_input_ids(input_ids, padding_idx, past_key_values_length)`
  (modeling_roberta.py l. 1477-1490: `(cumsum(mask) + past_key_values_length) * mask + padding_idx`);
* `BertSelfAttention`: `key_layer = torch.cat([past_key_value[0], key_layer], dim=2)` (same for values, l. 271-275),
  scores `q k^T / sqrt(d)` plus the extended mask `(1.0 - mask) * -10000.0` of the prefix-extended attention mask
  (`torch.cat((prefix_attention_mask, attention_mask), dim=1)` in cl_forward / sentemb_forward);
* the rest of the layer as BERT's (dense + residual LayerNorm, GELU feed-forward).

Dropout is off (the tests compare in eval mode or with zero dropout). Nothing here imports the framework.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def official_get_prompt(prefix_state: dict[str, torch.Tensor], *, batch_size: int, pre_seq_len: int, n_layer: int,
                        n_head: int, n_embd: int, prefix_projection: bool) -> tuple[torch.Tensor, ...]:
    """`PrefixEncoder.forward(prefix_tokens)` then `get_prompt`: view, (dropout), permute([2, 0, 3, 1, 4]),
    split(2) -> n_layer tensors [2, B, heads, P, d]."""
    prefix_tokens = torch.arange(pre_seq_len).long().unsqueeze(0).expand(batch_size, -1)
    if prefix_projection:
        prefix_embeds = F.embedding(prefix_tokens, prefix_state["embedding.weight"])
        hidden = torch.tanh(F.linear(prefix_embeds, prefix_state["trans.0.weight"], prefix_state["trans.0.bias"]))
        past_key_values = F.linear(hidden, prefix_state["trans.2.weight"], prefix_state["trans.2.bias"])
    else:
        past_key_values = F.embedding(prefix_tokens, prefix_state["embedding.weight"])
    past_key_values = past_key_values.view(batch_size, pre_seq_len, n_layer * 2, n_head, n_embd)
    return past_key_values.permute([2, 0, 3, 1, 4]).split(2)


def official_encoder(model, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                     past_key_values: tuple[torch.Tensor, ...], roberta: bool) -> torch.Tensor:
    """transformers 4.2.1's BertModel/RobertaModel forward with past_key_values, explicitly: last_hidden_state."""
    config = model.config
    batch_size, seq_length = input_ids.shape
    past_key_values_length = past_key_values[0][0].shape[2]
    # embeddings
    if roberta:
        padding_idx = model.embeddings.padding_idx
        mask = input_ids.ne(padding_idx).int()
        position_ids = ((torch.cumsum(mask, dim=1).type_as(mask) + past_key_values_length) * mask).long() + padding_idx
    else:
        position_ids = torch.arange(past_key_values_length, seq_length + past_key_values_length).unsqueeze(0)
    token_type_ids = torch.zeros_like(input_ids)
    emb = model.embeddings
    hidden = (emb.word_embeddings.weight[input_ids] + emb.position_embeddings.weight[position_ids]
              + emb.token_type_embeddings.weight[token_type_ids])
    eps = config.layer_norm_eps
    hidden = F.layer_norm(hidden, (config.hidden_size,), emb.LayerNorm.weight, emb.LayerNorm.bias, eps)
    # the extended mask: get_extended_attention_mask of the prefix-extended 2D mask
    extended = (1.0 - attention_mask[:, None, None, :].float()) * -10000.0
    heads = config.num_attention_heads
    head_size = config.hidden_size // heads

    def transpose_for_scores(x):
        return x.view(*x.shape[:-1], heads, head_size).permute(0, 2, 1, 3)

    for index, layer in enumerate(model.encoder.layer):
        attention = layer.attention.self
        past_key_value = past_key_values[index]
        query = transpose_for_scores(F.linear(hidden, attention.query.weight, attention.query.bias))
        key = transpose_for_scores(F.linear(hidden, attention.key.weight, attention.key.bias))
        value = transpose_for_scores(F.linear(hidden, attention.value.weight, attention.value.bias))
        key = torch.cat([past_key_value[0], key], dim=2)
        value = torch.cat([past_key_value[1], value], dim=2)
        scores = torch.matmul(query, key.transpose(-1, -2)) / math.sqrt(head_size) + extended
        probs = torch.softmax(scores, dim=-1)
        context = torch.matmul(probs, value).permute(0, 2, 1, 3).reshape(batch_size, seq_length, config.hidden_size)
        out = layer.attention.output
        attended = F.layer_norm(F.linear(context, out.dense.weight, out.dense.bias) + hidden, (config.hidden_size,),
                                out.LayerNorm.weight, out.LayerNorm.bias, eps)
        inner = F.gelu(F.linear(attended, layer.intermediate.dense.weight, layer.intermediate.dense.bias))
        out = layer.output
        hidden = F.layer_norm(F.linear(inner, out.dense.weight, out.dense.bias) + attended, (config.hidden_size,),
                              out.LayerNorm.weight, out.LayerNorm.bias, eps)
    return hidden


def official_pooled(model, prefix_state, mlp_state, input_ids, attention_mask, *, pre_seq_len: int,
                    prefix_projection: bool, roberta: bool, with_mlp: bool) -> torch.Tensor:
    """One encoder pass as cl_forward / sentemb_forward run it with pooler_type=cls: prompts for every row, the
    mask extended, [CLS] of the last layer, then `MLPLayer` (dense + tanh) when `with_mlp` (cl_forward always;
    sentemb_forward unless mlp_only_train)."""
    config = model.config
    batch_size = input_ids.shape[0]
    past_key_values = official_get_prompt(prefix_state, batch_size=batch_size, pre_seq_len=pre_seq_len,
                                          n_layer=config.num_hidden_layers, n_head=config.num_attention_heads,
                                          n_embd=config.hidden_size // config.num_attention_heads,
                                          prefix_projection=prefix_projection)
    prefix_attention_mask = torch.ones(batch_size, pre_seq_len)
    extended_mask = torch.cat((prefix_attention_mask, attention_mask.float()), dim=1)
    last_hidden = official_encoder(model, input_ids, extended_mask, past_key_values, roberta)
    pooler_output = last_hidden[:, 0]
    if with_mlp:
        pooler_output = torch.tanh(F.linear(pooler_output, mlp_state["dense.weight"], mlp_state["dense.bias"]))
    return pooler_output


def official_cl_loss(pooler_output: torch.Tensor, *, temp: float, hard_negative_weight: float = 0.0,
                     do_eh_loss: bool = False, eh_loss_margin: float = 0.2,
                     eh_loss_weight: float = 10.0) -> torch.Tensor:
    """cl_forward's loss from `pooler_output` [bs, num_sent, H] (one process: no all_gather)."""
    cos = torch.nn.CosineSimilarity(dim=-1)

    def sim(x, y):
        return cos(x, y) / temp

    num_sent = pooler_output.shape[1]
    z1, z2 = pooler_output[:, 0], pooler_output[:, 1]
    cos_sim = sim(z1.unsqueeze(1), z2.unsqueeze(0))
    margin_loss = None
    if num_sent >= 3:
        z3 = pooler_output[:, 2]
        z1_z3_cos = sim(z1.unsqueeze(1), z3.unsqueeze(0))
        cos_sim = torch.cat([cos_sim, z1_z3_cos], 1)
        if do_eh_loss:
            z1_z2_cos = sim(z1.unsqueeze(1), z2.unsqueeze(0))
            anchor_pos = torch.diag(z1_z2_cos).unsqueeze(dim=-1)
            vector = -1e9 * torch.ones(z1_z2_cos.size(0))
            mask = torch.diag(torch.ones_like(vector))
            z1_z2_cos_new = mask * torch.diag(vector) + (1. - mask) * z1_z2_cos
            max_s3_sn = torch.max(torch.cat([z1_z2_cos_new, z1_z3_cos], dim=-1), -1, keepdim=True)[0]
            rank_label = torch.ones_like(anchor_pos).long()
            margin_loss = torch.nn.MarginRankingLoss(margin=eh_loss_margin)(anchor_pos * temp, max_s3_sn * temp,
                                                                            rank_label)
    labels = torch.arange(cos_sim.size(0)).long()
    if num_sent == 3:
        weights = torch.tensor(
            [[0.0] * (cos_sim.size(-1) - z1_z3_cos.size(-1)) + [0.0] * i + [hard_negative_weight]
             + [0.0] * (z1_z3_cos.size(-1) - i - 1) for i in range(z1_z3_cos.size(-1))])
        cos_sim = cos_sim + weights
    loss = torch.nn.CrossEntropyLoss()(cos_sim, labels)
    if margin_loss is not None:
        loss = loss + eh_loss_weight * margin_loss
    return loss
