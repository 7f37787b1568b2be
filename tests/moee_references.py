"""A plain re-computation of MoEE's official code, step by step, on a stock transformers OLMoE / Qwen2-MoE model
loaded as the official script loads it (tokenizer `pad_token_id = 0`, left padding, no position ids).

Official code: tianyi-lab/MoE-Embedding@f80bebd7eb5b04115308b7324c7884dfc15eca35
* `moee.py` `MOEE.encode`: the prompt, HS, RW, the concatenation and the per-batch standardisation;
* `models/modeling_olmoe.py` `OlmoeSparseMoeBlock.forward` / `models/modeling_qwen2_moe.py`
  `Qwen2MoeSparseMoeBlock.forward`: `sent_emb = router_logits.view(batch_size, sequence_length, -1)`, where
  `router_logits = self.gate(hidden_states)` on the post-attention-normed input of the MoE block; the model stacks
  them over the blocks (`torch.cat(sent_embs, dim=1)`, [B, n_blocks, T, E]) and returns them beside its outputs.
  Stock transformers returns no such tensor, so this module recomputes it from the MoE block's input with the
  router's weight (`F.linear(x, gate.weight)`, the official `nn.Linear(hidden, experts, bias=False)`);
* `mteb/evaluation/evaluators/STSEvaluator.py`: `1 - paired_cosine_distances(...)` and, with
  `--similarity_ensemble`, `cosine_scores_main[i] + cosine_scores_aux[i] * similarity_weights`.
"""

from __future__ import annotations

import copy

import numpy as np
import torch
import torch.nn.functional as F

#: moee.py `encode`, `kwargs['embed_method']`: the prompts the STS runs use (verbatim)
PROMPTS = {
    "prompteol": ["This sentence : \"*sent 0*\" means in one word:\""],
    "none": ["\"*sent 0*\""],
}


def _router_inputs(model):
    """Forward pre-hooks on every MoE block (`layer.mlp` with a `gate`), in block order, capturing its input."""
    captured: list[torch.Tensor] = []
    handles, gates = [], []
    for layer in model.model.layers:
        if hasattr(layer.mlp, "gate"):  # a Qwen2-MoE dense block (mlp_only_layers) has no router
            gates.append(layer.mlp.gate)
            handles.append(layer.mlp.register_forward_pre_hook(lambda _m, args: captured.append(args[0])))
    return captured, handles, gates


@torch.no_grad()
def official_forward(model, prompts):
    """The modified modeling files' `outputs, sent_emb = self.model(**prompts, output_hidden_states=True,
    return_dict=True)`: sent_emb [B, n_blocks, T, E] = each router's logits."""
    captured, handles, gates = _router_inputs(model)
    try:
        outputs = model(**prompts, output_hidden_states=True, return_dict=True)
    finally:
        for handle in handles:
            handle.remove()
    batch_size, sequence_length = prompts["input_ids"].shape
    sent_embs = [F.linear(states.reshape(-1, states.shape[-1]), gate.weight).view(batch_size, sequence_length, -1)
                 .unsqueeze(1) for states, gate in zip(captured, gates, strict=True)]
    return outputs, torch.cat(sent_embs, dim=1)


@torch.no_grad()
def moee_encode_reference(model, tokenizer, sentences, *, emb_info: str, embed_method: str = "none",
                          batch_size: int = 128, routing: str = "logits"):
    """`MOEE.encode` with `instruction=""`, `embed_eos=""` (returns all_embeddings, all_default, all_moe_rw).
    `routing="softmax"` applies the DeepSeek-MoE file's `scores = logits.softmax(dim=-1)` (its `sent_emb`)."""
    tokenizer = copy.deepcopy(tokenizer)
    tokenizer.pad_token_id = 0
    tokenizer.padding_side = "left"
    all_embeddings, all_default, all_moe_rw = [], [], []
    for start_index in range(0, len(sentences), batch_size):
        sentences_batch = ["" + s + "" for s in sentences[start_index:start_index + batch_size]]
        prompt_templates = PROMPTS[embed_method]
        sentences_batch = [s.split(' ') for s in sentences_batch]
        prompts = []
        for sent in sentences_batch:
            sent = ' '.join(sent) if sent != [] else '.'
            if len(sent) > 0 and sent[-1] not in '.?!"\'':
                sent += '.'
            sent = sent.replace('"', '\'')
            for prompt in prompt_templates:
                prompts.append(prompt.replace('*sent 0*', sent).replace('_', ' ').strip())
        prompts = tokenizer(prompts, padding=True, return_tensors="pt")
        outputs, sent_emb = official_forward(model, prompts)
        if routing == "softmax":
            sent_emb = sent_emb.softmax(dim=-1)
        sent_emb = sent_emb.cpu()
        lst_token_emb = outputs.hidden_states[-1][:, -1, :].cpu()
        lst_token_rw = sent_emb[:, :, -1, :]
        lst_token_rw = torch.cat([lst_token_rw[:, i, :] for i in range(lst_token_rw.shape[1])], dim=1)
        if emb_info == 'HS':
            embeddings = lst_token_emb
        elif emb_info == 'RW':
            embeddings = lst_token_rw
        elif emb_info == 'MoEE':
            embeddings = torch.cat([lst_token_emb, lst_token_rw], dim=1)
        if emb_info != 'HS':
            mean = embeddings.mean(dim=0, keepdim=True)
            std = embeddings.std(dim=0, keepdim=True)
            embeddings = (embeddings - mean) / (std + 1e-8)
            mean = lst_token_emb.mean(dim=0, keepdim=True)
            std = lst_token_emb.std(dim=0, keepdim=True)
            lst_token_emb = (lst_token_emb - mean) / (std + 1e-8)
            mean = lst_token_rw.mean(dim=0, keepdim=True)
            std = lst_token_rw.std(dim=0, keepdim=True)
            lst_token_rw = (lst_token_rw - mean) / (std + 1e-8)
        all_embeddings.append(embeddings.cpu().numpy())
        all_default.append(lst_token_emb.cpu().numpy())
        all_moe_rw.append(lst_token_rw.cpu().numpy())
    all_embeddings = torch.from_numpy(np.concatenate(all_embeddings, axis=0))
    all_default = torch.from_numpy(np.concatenate(all_default, axis=0))
    all_moe_rw = torch.from_numpy(np.concatenate(all_moe_rw, axis=0))
    all_embeddings = torch.where(torch.isnan(all_embeddings), torch.zeros_like(all_embeddings), all_embeddings)
    all_default = torch.where(torch.isnan(all_default), torch.zeros_like(all_default), all_default)
    all_moe_rw = torch.where(torch.isnan(all_moe_rw), torch.zeros_like(all_moe_rw), all_moe_rw)
    return all_embeddings.numpy(), all_default.numpy(), all_moe_rw.numpy()


def paired_cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """`1 - sklearn.metrics.pairwise.paired_cosine_distances(a, b)`: rows L2-normalised (a zero row stays zero),
    then the row-wise dot product."""
    def normalize(x):
        norms = np.linalg.norm(x, axis=1, keepdims=True)
        return x / np.where(norms == 0, 1.0, norms)

    return (normalize(a.astype(np.float64)) * normalize(b.astype(np.float64))).sum(1)


def similarity_ensemble_reference(model, tokenizer, sentences1, sentences2, *, weight: float, emb_info: str = "MoEE",
                                  embed_method: str = "none", batch_size: int = 128) -> np.ndarray:
    """STSEvaluator with `--similarity_ensemble`: both sides encoded separately (`model_encode` of sentences1, then
    of sentences2), score_i = cos(default1_i, default2_i) + cos(moe_rw1_i, moe_rw2_i) * similarity_weights."""
    _, default1, moe_rw1 = moee_encode_reference(model, tokenizer, sentences1, emb_info=emb_info,
                                                 embed_method=embed_method, batch_size=batch_size)
    _, default2, moe_rw2 = moee_encode_reference(model, tokenizer, sentences2, emb_info=emb_info,
                                                 embed_method=embed_method, batch_size=batch_size)
    cosine_scores_main = paired_cosine(default1, default2)
    cosine_scores_aux = paired_cosine(moe_rw1, moe_rw2)
    return np.array([cosine_scores_main[i] + cosine_scores_aux[i] * weight for i in range(len(cosine_scores_aux))])
