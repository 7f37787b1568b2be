"""Plain re-computations of the decoder prompt methods, each following its official implementation step by step
(commit named per function), on a model and tokenizer loaded as the official scripts load them."""

from __future__ import annotations

import copy
import re

import torch

from promptemb.encoder.decoder import placeholder_embedding


def official_sentence(s: str) -> str:
    """kongds/scaling_sentemb@8567aa083c1b3c77586670f91e7f78eb80694ad3 evaluation.py `batcher` (the same lines in
    PretCoTandKE, MetaEOL, token_prepending and CP)."""
    if len(s) > 0 and s[-1] not in '.?"\'':
        s += '.'
    s = s.replace('"', '\'')
    if len(s) > 0 and '?' == s[-1]:  # noqa: SIM300 (the official line)
        s = s[:-1] + '.'
    return s


def official_template(text: str) -> str:
    """The repositories write `*sent_0*` (with `_` for spaces in scaling_sentemb) and fill `*sent 0*`."""
    return text.replace("[X]", "*sent_0*").replace("_", " ")


def left_padded(tokenizer):
    """`tokenizer.pad_token_id = 0; tokenizer.padding_side = "left"` as every official evaluation sets them."""
    tokenizer = copy.deepcopy(tokenizer)
    tokenizer.pad_token_id = 0
    tokenizer.padding_side = "left"
    return tokenizer


@torch.no_grad()
def last_token_reference(model, tokenizer, sentences, templates, layer: int) -> torch.Tensor:
    """PromptEOL / PretCoT / KE / MetaEOL: fill every template (`template.replace('*sent 0*', s).strip()`), one
    left-padded `batch_encode_plus` (special tokens on), `hidden_states[layer][:, -1, :]`, then
    `view(-1, len(templates), D).mean(dim=1)` (MetaEOL; a no-op for one template).
    scaling_sentemb@8567aa0 evaluation.py; PretCoTandKE@ad3a799 evaluation.py (`hidden_states[-2]` for PCoT/KE);
    MetaEOL@c62096d evaluation.py."""
    tokenizer = left_padded(tokenizer)
    templates = [official_template(t) for t in templates]
    texts = [t.replace("*sent 0*", official_sentence(s)).strip() for s in sentences for t in templates]
    batch = tokenizer(texts, return_tensors="pt", padding=True)  # v4 batch_encode_plus
    hidden_states = model(output_hidden_states=True, return_dict=True, **batch).hidden_states
    outputs = hidden_states[layer][:, -1, :]
    return outputs.view(-1, len(templates), outputs.size()[1]).mean(dim=1)


#: zifengcheng/CP@bf5ee560263e8876b67a3fdf4f67ff7c46f60f50 evaluate_intervention.py, `--prompt_method ck`, verbatim
CP_CK_PROMPTS = [
    'The essence of a sentence is often captured by its main subjects and actions, while descriptive terms provide '
    'additional but less central details. With this in mind , this sentence : \"*sent 0*\" means in one word:\"',
    'After thinking step by step , this sentence : \"*sent 0*\" means in one word:\"',
]


@torch.no_grad()
def ck_reference(model, tokenizer, sentences, output_layer: int = -1) -> torch.Tensor:
    """zifengcheng/CP@bf5ee56 evaluate_intervention.py `batcher` with `--prompt_method ck` and no intervention: per
    sentence the official rule, then both prompts (`prompt.replace('*sent 0*', s).strip()`), one left-padded batch of
    all rows, `hidden_states[args.output_layer][:, -1, :]` (one layer for both prompts: the script sets -2 for `ke`
    alone, not for `ck`), `view(-1, len(task_prompts), D).mean(dim=1)`."""
    tokenizer = left_padded(tokenizer)
    task_prompts = CP_CK_PROMPTS
    new_sentences = []
    for s in sentences:
        if len(s) > 0 and s[-1] not in '.?"\'':
            s += '.'
        s = s.replace('"', '\'')
        if len(s) > 0 and '?' == s[-1]:  # noqa: SIM300 (the official line)
            s = s[:-1] + '.'
        for prompt in task_prompts:
            new_sentences.append(prompt.replace('*sent 0*', s).strip())
    batch = tokenizer(new_sentences, return_tensors="pt", padding=True)  # v4 batch_encode_plus
    hidden_states = model(output_hidden_states=True, return_dict=True, **batch).hidden_states
    outputs = hidden_states[output_layer][:, -1, :]
    return outputs.view(-1, len(task_prompts), outputs.size()[1]).mean(dim=1)


def scaling_sentemb_batch(tokenizer, sentences, mask_embedding_sentence_template: str) -> dict:
    """kongds/scaling_sentemb@8567aa0 evaluation.py `batcher` with `--mask_embedding_sentence` and a template as
    run_icl.sh passes it (`_` for spaces): `_` -> space, `*sep+*` / `*cls*` dropped, the official rule per sentence,
    `template.replace('*sent 0*', s).strip()`, one left-padded `batch_encode_plus` (special tokens on)."""
    tokenizer = left_padded(tokenizer)
    sentences = list(sentences)
    template = mask_embedding_sentence_template
    template = template.replace('_', ' ').replace('*sep+*', '').replace('*cls*', '')
    for i, s in enumerate(sentences):
        sentences[i] = template.replace('*sent 0*', official_sentence(s)).strip()
    return tokenizer(sentences, return_tensors="pt", padding=True)


@torch.no_grad()
def scaling_sentemb_reference(model, tokenizer, sentences, mask_embedding_sentence_template: str) -> torch.Tensor:
    """The same batcher's embedding: `hidden_states[-1][:, -1, :]`."""
    batch = scaling_sentemb_batch(tokenizer, sentences, mask_embedding_sentence_template)
    return model(output_hidden_states=True, return_dict=True, **batch).hidden_states[-1][:, -1, :]


@torch.no_grad()
def echo_reference(base_model, tokenizer, sentences, template: str, strategy: str, max_length=None) -> torch.Tensor:
    """jakespringer/echo-embeddings@c752c4641d3e78378934e860ac76843f8a5d1880 echo_embeddings.py: `EchoParser`
    (pieces split at `{...}`, each tokenized on its own; the tokenizer is loaded with add_bos_token=False,
    add_eos_token=False, i.e. no special tokens added: `add_special_tokens=False` here), right padding,
    `EchoEmbeddingsMistral` (`AutoModel(...).last_hidden_state`), `EchoPooling` (mean or last over `embed_mask`)."""
    matches = list(re.finditer(r'\{(.|\n|\r|\t)+?\}', template))
    pieces = []
    for i, m in enumerate(matches):
        pieces.append(template[:m.start()] if i == 0 else template[matches[i - 1].end():m.start()])
        pieces.append(m.group())
    pieces.append(template[matches[-1].end():])
    pieces = [p for p in pieces if p]
    parsed = [p[1:-1] if p.startswith("{") and p.endswith("}") else tokenizer(p, add_special_tokens=False)["input_ids"]
              for p in pieces]
    rows = []
    for sentence in sentences:
        ids, embed_mask = [], []
        for piece in parsed:
            if isinstance(piece, str):
                value = 1
                if piece.startswith("!"):
                    piece, value = piece[1:], 0
                piece_ids = tokenizer(piece.replace("%%text%%", sentence), add_special_tokens=False)["input_ids"]
                piece_ids = piece_ids[:max_length] if max_length is not None else piece_ids
            else:
                piece_ids, value = piece[:max_length] if max_length is not None else piece, 0
            ids += piece_ids
            embed_mask += [value] * len(piece_ids)
        rows.append((ids, embed_mask))
    width = max(len(ids) for ids, _ in rows)
    pad = tokenizer.pad_token_id
    input_ids = torch.tensor([ids + [pad] * (width - len(ids)) for ids, _ in rows])
    attention_mask = torch.tensor([[1] * len(ids) + [0] * (width - len(ids)) for ids, _ in rows])
    embed_mask = torch.tensor([mask + [0] * (width - len(mask)) for _, mask in rows])
    token_embeddings = base_model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    if strategy == "mean":
        pooled = torch.sum(token_embeddings * embed_mask.unsqueeze(-1), dim=1) / torch.sum(embed_mask, 1).unsqueeze(-1)
    else:
        last = torch.tensor([int(torch.max((m == 1).nonzero(as_tuple=True)[0])) for m in embed_mask])
        pooled = token_embeddings[torch.arange(len(rows)), last]
    return pooled


@torch.no_grad()
def token_prepending_reference(causal_lm, tokenizer, sentences, template: str, layer: int, start: int, exit: int,
                               seed: int | None = None, row: torch.Tensor | None = None) -> torch.Tensor:
    """fuyuchenIfyw/token_prepending@cc41b58696d6dceed9a92a840231728ad1d5b58b: evaluate.py adds `<PST>` to the
    tokenizer (a no-op when it has the token), resizes the embeddings and writes a N(0, 1) row (here drawn from the
    seeded generator the framework uses, or the given `row`: the official method with that row);
    senllm/modeling_llama.py `LlamaModel.forward` with plan "tp": positions `arange(T)`, and before block `index` with
    start <= index < exit, `hidden_states[arange(B), pst] = hidden_states[:, -1, :]` (first `<PST>` by
    `argmax`), then the final norm; the batcher takes `hidden_states[output_layer][:, -1, :]`."""
    from transformers.masking_utils import create_causal_mask

    tokenizer = left_padded(tokenizer)
    tokenizer.add_tokens(["<PST>"])
    placeholder_token_id = tokenizer.convert_tokens_to_ids("<PST>")
    model = copy.deepcopy(causal_lm)
    model.resize_token_embeddings(len(tokenizer))
    embedding_layer = model.get_input_embeddings()
    if row is None:
        row = placeholder_embedding(seed, embedding_layer.weight.shape[1])
    embedding_layer.weight[placeholder_token_id] = row
    texts = [official_template(template).replace("*sent 0*", official_sentence(s)).strip() for s in sentences]
    batch = tokenizer(texts, return_tensors="pt", padding=True)  # v4 batch_encode_plus
    input_ids, attention_mask = batch["input_ids"], batch["attention_mask"]
    pst_token_indices = (input_ids == placeholder_token_id).float().argmax(dim=1)
    base = model.model
    hidden_states = base.embed_tokens(input_ids)
    position_ids = torch.arange(input_ids.shape[1]).unsqueeze(0)
    causal_mask = create_causal_mask(config=base.config, inputs_embeds=hidden_states, attention_mask=attention_mask,
                                     past_key_values=None, position_ids=position_ids)
    position_embeddings = base.rotary_emb(hidden_states, position_ids=position_ids)
    all_hidden_states = ()
    batch_rows = torch.arange(input_ids.shape[0])
    for index, decoder_layer in enumerate(base.layers):
        all_hidden_states += (hidden_states,)
        if start <= index < exit:
            previous_sentence_embeddings = hidden_states[:, -1, :].clone()
            hidden_states[batch_rows, pst_token_indices, :] = previous_sentence_embeddings
        hidden_states = decoder_layer(hidden_states, attention_mask=causal_mask, position_ids=position_ids,
                                      position_embeddings=position_embeddings)
    all_hidden_states += (base.norm(hidden_states),)
    return all_hidden_states[layer][:, -1, :]


@torch.no_grad()
def contrastive_prompting_reference(causal_lm, tokenizer, sentences, template: str, auxiliary: str, layer: int,
                                    act_layer: int, coeff: float, projection: str = "o_proj") -> torch.Tensor:
    """zifengcheng/CP@bf5ee560263e8876b67a3fdf4f67ff7c46f60f50: evaluate_intervention.py + activation_intervention
    (plan `scaled`, location `att_head`): `get_o_proj_input` runs the auxiliary ("negative") prompts as their own
    left-padded batch and keeps the input of block `act_layer`'s `self_attn.o_proj`; the main batch then runs with a
    forward pre-hook on that module: `residual_input[:, -1:, :] = coeff * (residual_input[:, -1:, :] -
    negative[:, -1:, :])`; `hidden_states[output_layer][:, -1, :]`. (The official aux forward exits after block
    `act_layer`; the captured input is the same.) `projection` names OPT's equivalent module (`out_proj`)."""
    tokenizer = left_padded(tokenizer)
    texts = [official_template(template).replace("*sent 0*", official_sentence(s)).strip() for s in sentences]
    negatives = [official_template(auxiliary).replace("*sent 0*", official_sentence(s)).strip() for s in sentences]
    blocks = causal_lm.model.layers if hasattr(causal_lm.model, "layers") else causal_lm.model.decoder.layers
    o_proj = getattr(blocks[act_layer].self_attn, projection)
    o_proj_inputs = []
    handle = o_proj.register_forward_hook(lambda module, inputs, outputs: o_proj_inputs.append(inputs[0]))
    causal_lm(**tokenizer(negatives, return_tensors="pt", padding=True))
    handle.remove()
    negative_activations_batch = o_proj_inputs[0]

    def _scaled_difference_hook(_, inputs):
        residual_input, = inputs
        activation_diff = residual_input[:, -1:, :] - negative_activations_batch[:, -1:, :]
        residual_input[:, -1:, :] = coeff * activation_diff
        return residual_input

    handle = o_proj.register_forward_pre_hook(_scaled_difference_hook)
    try:
        batch = tokenizer(texts, return_tensors="pt", padding=True)  # v4 batch_encode_plus
        hidden_states = causal_lm(output_hidden_states=True, return_dict=True, **batch).hidden_states
    finally:
        handle.remove()
    return hidden_states[layer][:, -1, :]
