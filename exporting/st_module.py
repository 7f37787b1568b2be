"""sentence-transformers module of a promptemb export: prompt template at the token level + [MASK] / avg pooling for
encoders, the template's last token for decoders (causal LMs).

Copied by export.py into every export directory as `promptemb_st_module.py` and loaded with
`SentenceTransformer(DIR, trust_remote_code=True)`. The directory is also a plain Hugging Face model directory
(config.json + weights + tokenizer); this module reads the `promptemb` block of its config.json.

WHY THIS FILE DUPLICATES FRAMEWORK CODE: an export must load where promptemb is not installed, so this file imports
only torch, transformers and sentence-transformers. It re-implements, minimally, the framework's
* encoder/inputs.py            `[CLS] prefix sentence[:max_sentence_tokens] suffix [SEP]` (template ids recorded),
                               sentence rules, [MASK] positions found by offset (never by token search);
* encoder/forward.py           template bias for denoising: [MASK] state of `[CLS] prefix suffix [SEP]` with the
                               position ids after the prefix shifted by the sentence length n;
* poolers/mask.py, mean.py     [MASK] mean or one [MASK] (`which_mask`; optionally through the MLM-transform head,
                               minus the bias) and `avg`;
* lightning_modules/soft_template.py   OptiPrompt's soft template written into `inputs_embeds`;
* lightning_modules/deep_prompt.py     DCPCSE's prefixes: keys/values in front of every layer's self-attention (its
                               `cache` argument), the 4D mask extended, the tokens' positions started after them;
                               [CLS] pooling (through the trained tanh head when there is one);
* encoder/decoder.py           decoders: the sentence cut to its first `max_sentence_tokens` tokens (at that token's
                               character offset), the sentence rule, the filled template stripped and tokenized as
                               ONE string framed by the tokenizer's own special ids, padding on the recorded side,
                               position ids counted over real tokens, the last real token pooled at the layer;
* lightning_modules/prompteol.py   a kept LoRA adapter applied (peft, imported only then) to the recorded base model,
                               whose weights must hash to the recorded sha256;
* encoder/decoder.py, poolers/llm2vec.py, encoder/bidirectional.py   a decoder of an LLM2Vec recipe: the sentence
                               cut, `instruction + " " + sentence (+ end text)` tokenized whole, the last n tokens
                               (the sentence's own count) pooled (mean, weighted mean, last token, or the first
                               BOS token) from one forward with the causal mask removed (the padding-only 4D mask,
                               `is_causal=False`).
tests/exporting/test_export.py (encoders, tiny BERTs) and tests/exporting/test_export_decoder.py (tiny LLaMA / OPT /
GPT-2) compare this file with those (many lengths, truncation, padding sides, batch compositions): change them together.
"""

from __future__ import annotations

import hashlib
import json
import os

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import AutoModel, AutoTokenizer
from transformers.activations import ACT2FN

try:  # sentence-transformers >= 6
    from sentence_transformers.base.modules import InputModule
except ImportError:  # sentence-transformers 5.x
    from sentence_transformers.models import InputModule


def apply_sentence_rule(sentence: str, rule: str) -> str:
    if rule == "none":
        return sentence
    if sentence and sentence[-1] not in ".?\"'":  # append_period and promptbert (the same rule)
        sentence += "."
    if rule == "prompteol":  # the decoder methods' rule: then `"` -> `'` and a final `?` -> `.`
        sentence = sentence.replace('"', "'")
        if sentence.endswith("?"):
            sentence = sentence[:-1] + "."
    return sentence


class PrefixCache:
    """A self-attention module's `cache`: `update` returns the prefix keys/values in front of the tokens' own."""

    def __init__(self, key: torch.Tensor, value: torch.Tensor):
        self.key, self.value = key, value

    def update(self, key_states, value_states, layer_idx=None, *args, **kwargs):
        return (torch.cat([self.key.to(key_states.dtype), key_states], dim=2),
                torch.cat([self.value.to(value_states.dtype), value_states], dim=2))


def special_frame(tokenizer) -> tuple[list[int], list[int]]:
    """The special ids the tokenizer puts before and after a text (LLaMA `[<s>]`, `[]`; OPT `[</s>]`, `[]`)."""
    plain = tokenizer("a", add_special_tokens=False)["input_ids"]
    full = tokenizer("a", add_special_tokens=True)["input_ids"]
    for start in range(len(full) - len(plain) + 1):
        if full[start : start + len(plain)] == plain:
            return full[:start], full[start + len(plain) :]
    return [], []


def weights_sha256(model) -> str:
    """sha256 over every parameter and buffer (name, dtype, shape, bytes, in name order): the identity of the base
    weights a LoRA adapter was trained on."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        data = tensor.detach().cpu().contiguous()
        digest.update(f"{name}:{data.dtype}:{tuple(data.shape)}\n".encode())
        digest.update(data.view(torch.uint8).numpy().tobytes() if data.numel() else b"")
    return digest.hexdigest()


class MLMTransformHead(nn.Module):
    """h -> LayerNorm(act(W h + b)) (the supervised recipe's head)."""

    def __init__(self, hidden_size: int, activation: str, eps: float):
        super().__init__()
        self.dense = nn.Linear(hidden_size, hidden_size)
        self.activation = ACT2FN[activation]
        self.layer_norm = nn.LayerNorm(hidden_size, eps=eps)

    def forward(self, hidden):
        return self.layer_norm(self.activation(self.dense(hidden)))


class TanhMLPHead(nn.Module):
    """h -> tanh(W h + b) (the supervised RoBERTa recipe's head, applied to the denoised state)."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.dense = nn.Linear(hidden_size, hidden_size)
        self.activation = nn.Tanh()

    def forward(self, hidden):
        return self.activation(self.dense(hidden))


class PromptEncoderModule(InputModule):
    """Input module + encoder + pooler in one (the template bias needs the transformer inside the pooler)."""

    save_in_root = True

    def __init__(self, model_dir: str, model_kwargs: dict | None = None):
        super().__init__()
        with open(os.path.join(model_dir, "config.json"), encoding="utf-8") as handle:
            record = json.load(handle)["promptemb"]
        self.record = record
        self.decoder = record.get("decoder")
        self.llm2vec = record.get("llm2vec")
        if self.decoder:
            self._init_decoder(model_dir, dict(model_kwargs or {}))
            return
        self.model = AutoModel.from_pretrained(model_dir, **(model_kwargs or {}))
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.prefix_ids, self.suffix_ids = list(record["prefix_ids"]), list(record["suffix_ids"])
        self.max_seq_length = int(record["max_length"])
        self.max_sentence_tokens = int(record["max_sentence_tokens"])
        pooler = record["pooler"]
        self.pooler_name, self.layer, self.denoise = pooler["name"], int(pooler["layer"]), bool(pooler["denoise"])
        self.which_mask = pooler.get("which_mask")
        hidden = self.model.config.hidden_size
        self.head, self.head_after_denoise = None, False
        if pooler.get("head") and self.pooler_name in ("mask", "cls"):
            if pooler["head"].get("type") == "tanh_mlp":
                self.head, self.head_after_denoise = TanhMLPHead(hidden), bool(pooler["head"].get("after_denoise"))
            else:
                self.head = MLMTransformHead(hidden, pooler["head"]["activation"], pooler["head"]["layer_norm_eps"])
            self.head.load_state_dict(load_file(os.path.join(model_dir, pooler["head"]["file"])))
        self.soft_vectors = None
        if record.get("soft_template"):
            vectors = load_file(os.path.join(model_dir, record["soft_template"]["file"]))["vectors"]
            self.soft_vectors = nn.Parameter(vectors, requires_grad=False)
        self.deep_prompt = record.get("deep_prompt")
        if self.deep_prompt:
            self._attach_deep_prompt(model_dir)
        template_ids = torch.tensor(self.prefix_ids + self.suffix_ids, dtype=torch.long)
        self.register_buffer("template_is_mask", template_ids == self.tokenizer.mask_token_id, persistent=False)
        padding_idx = getattr(getattr(self.model, "embeddings", None), "padding_idx", None)
        self.position_base = 0 if padding_idx is None else int(padding_idx) + 1

    def _attach_deep_prompt(self, model_dir: str) -> None:
        """The prefixes (inference: no dropout) as buffers [2·layers, heads, P, d], hooked into the model."""
        with open(os.path.join(model_dir, self.deep_prompt["config"]), encoding="utf-8") as handle:
            self.deep_prompt_config = json.load(handle)
        self.deep_prompt_state = load_file(os.path.join(model_dir, self.deep_prompt["file"]))
        config, state = self.deep_prompt_config, self.deep_prompt_state
        if config["projection"]:
            hidden = torch.tanh(state["embedding.weight"] @ state["trans.0.weight"].T + state["trans.0.bias"])
            prefixes = hidden @ state["trans.2.weight"].T + state["trans.2.bias"]
        else:
            prefixes = state["embedding.weight"]
        heads, length = config["num_heads"], config["length"]
        shaped = prefixes.view(length, 2 * config["num_layers"], heads, config["hidden_size"] // heads)
        self.register_buffer("prefix_key_values", shaped.permute(1, 2, 0, 3).contiguous(), persistent=False)
        self.model.embeddings.register_forward_pre_hook(self._prefix_positions, with_kwargs=True)
        for index, layer in enumerate(self.model.encoder.layer):
            layer.attention.self.register_forward_pre_hook(self._prefix_attention(index), with_kwargs=True)

    def _prefix_positions(self, module, args, kwargs):
        source = kwargs.get("input_ids") if kwargs.get("input_ids") is not None else kwargs["inputs_embeds"]
        self._batch_size = source.shape[0]
        length = self.deep_prompt_config["length"]
        if kwargs.get("position_ids") is None:
            kwargs["cache_length"] = length  # the model's default positions, started after the prefix
        else:
            kwargs["position_ids"] = kwargs["position_ids"] + length
        return args, kwargs

    def _prefix_attention(self, index: int):
        def hook(module, args, kwargs):
            shape = (self._batch_size, *self.prefix_key_values.shape[1:])
            key = self.prefix_key_values[2 * index].expand(shape)
            value = self.prefix_key_values[2 * index + 1].expand(shape)
            kwargs["cache"] = PrefixCache(key, value)
            mask = kwargs.get("attention_mask")
            if mask is not None:  # [B, 1, Lq, Lk]: the prefix columns visible (True / 0.0)
                front = torch.ones if mask.dtype == torch.bool else torch.zeros
                kwargs["attention_mask"] = torch.cat(
                    [front((*mask.shape[:-1], self.deep_prompt_config["length"]), dtype=mask.dtype,
                           device=mask.device), mask], dim=-1)
            return args, kwargs
        return hook

    def _init_decoder(self, model_dir: str, model_kwargs: dict) -> None:
        """A causal LM: `model_kwargs["promptemb_base_model"]` points a kept adapter at its base model when the
        recorded name no longer resolves."""
        record = self.record
        base_model = model_kwargs.pop("promptemb_base_model", None)
        if record.get("adapter"):
            self.model = self._load_with_adapter(model_dir, record["adapter"], base_model, model_kwargs)
        else:
            self.model = AutoModel.from_pretrained(model_dir, **model_kwargs)
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.max_seq_length = int(record["max_length"])
        self.max_sentence_tokens = int(record["max_sentence_tokens"])
        self.pooler_name, self.layer, self.denoise = record["pooler"]["name"], int(record["pooler"]["layer"]), False
        self.head, self.head_after_denoise, self.soft_vectors, self.deep_prompt = None, False, None, None
        if self.llm2vec is None:  # LLM2Vec reads the plain sentence
            self.template_prefix, self.template_suffix = record["template"].split("[X]")
        self.special_prefix = list(self.decoder["special_prefix_ids"])
        self.special_suffix = list(self.decoder["special_suffix_ids"])
        self.pad_id, self.padding_side = int(self.decoder["pad_id"]), self.decoder["padding_side"]
        if list(map(list, special_frame(self.tokenizer))) != [self.special_prefix, self.special_suffix]:
            raise ValueError(f"{model_dir}: the tokenizer does not add the recorded special tokens "
                             f"{self.special_prefix} ... {self.special_suffix}")

    @staticmethod
    def _load_with_adapter(model_dir: str, adapter: dict, base_model: str | None, model_kwargs: dict):
        import peft  # only an export that kept its LoRA adapter needs it

        name = base_model or adapter["base_model"]
        kwargs = {"dtype": getattr(torch, adapter.get("dtype") or "float32"), **model_kwargs}
        if adapter.get("quantization") == "4bit":  # as the adapter was trained (QLoRA's NF4)
            from transformers import BitsAndBytesConfig

            kwargs["quantization_config"] = BitsAndBytesConfig(
                load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                bnb_4bit_compute_dtype=torch.bfloat16)
        base = AutoModel.from_pretrained(name, **kwargs)
        digest = weights_sha256(base)
        if digest != adapter["base_weights_sha256"]:
            raise ValueError(f"the adapter in {model_dir} was trained on base weights sha256 "
                             f"{adapter['base_weights_sha256'][:12]}..., but {name!r} has {digest[:12]}...; pass "
                             "model_kwargs={'promptemb_base_model': PATH} with the model it was trained from")
        return peft.PeftModel.from_pretrained(base, os.path.join(model_dir, adapter["dir"])).eval()

    @classmethod
    def load(cls, model_name_or_path: str, subfolder: str = "", token=None, cache_folder=None, revision=None,
             local_files_only: bool = False, model_kwargs: dict | None = None, **kwargs):
        directory = os.path.join(model_name_or_path, subfolder)
        if not os.path.isdir(directory):
            directory = cls.load_dir_path(model_name_or_path, subfolder=subfolder, token=token,
                                          cache_folder=cache_folder, revision=revision,
                                          local_files_only=local_files_only)
        return cls(directory, model_kwargs=model_kwargs)

    def save(self, output_path: str, *args, safe_serialization: bool = True, **kwargs) -> None:
        if self.decoder and self.record.get("adapter"):  # the adapter files, and the base model's config
            self.model.save_pretrained(os.path.join(output_path, self.record["adapter"]["dir"]),
                                       safe_serialization=safe_serialization)
            config = self.model.get_base_model().config
            config.promptemb = self.record
            config.save_pretrained(output_path)
            self.tokenizer.save_pretrained(output_path)
            return
        self.model.config.promptemb = self.record
        self.model.save_pretrained(output_path, safe_serialization=safe_serialization)
        self.tokenizer.save_pretrained(output_path)
        if self.head is not None:
            save_file({k: v.contiguous() for k, v in self.head.state_dict().items()},
                      os.path.join(output_path, self.record["pooler"]["head"]["file"]))
        if self.soft_vectors is not None:
            save_file({"vectors": self.soft_vectors.detach().contiguous()},
                      os.path.join(output_path, self.record["soft_template"]["file"]))
        if self.deep_prompt:
            save_file({k: v.contiguous() for k, v in self.deep_prompt_state.items()},
                      os.path.join(output_path, self.deep_prompt["file"]))
            with open(os.path.join(output_path, self.deep_prompt["config"]), "w", encoding="utf-8") as handle:
                handle.write(json.dumps(self.deep_prompt_config, indent=2) + "\n")

    def get_embedding_dimension(self) -> int:
        return int(self.model.config.hidden_size)

    get_sentence_embedding_dimension = get_embedding_dimension  # sentence-transformers 5.x name

    # -- inputs (encoder/inputs.py) -------------------------------------------------------------------------------

    def preprocess(self, inputs, prompt: str | None = None, **kwargs) -> dict[str, torch.Tensor]:
        texts = [prompt + text if prompt else text for text in inputs]
        if self.decoder:
            return self.decoder_preprocess(texts)
        texts = [apply_sentence_rule(text, self.record["sentence_rule"]) for text in texts]
        if self.record.get("sentence_leading_space"):  # the template's space before [X] (encoder/inputs.py)
            texts = [" " + text for text in texts]
        sentence_ids = self.tokenizer(texts, add_special_tokens=False)["input_ids"]
        cls_id, sep_id, pad_id = self.tokenizer.cls_token_id, self.tokenizer.sep_token_id, self.tokenizer.pad_token_id
        rows = [[cls_id, *self.prefix_ids, *ids[: self.max_sentence_tokens], *self.suffix_ids, sep_id]
                for ids in sentence_ids]
        width = max(len(row) for row in rows)
        input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
        attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
        for index, row in enumerate(rows):
            input_ids[index, : len(row)] = torch.tensor(row)
            attention_mask[index, : len(row)] = 1
        lengths = torch.tensor([min(len(ids), self.max_sentence_tokens) for ids in sentence_ids], dtype=torch.long)
        return {"input_ids": input_ids, "attention_mask": attention_mask, "sentence_lengths": lengths}

    # -- decoder inputs (encoder/decoder.py) -----------------------------------------------------------------------

    def _cut(self, sentence: str, limit: int) -> str:
        """The sentence cut to its first `limit` tokens, at that token's end in the text."""
        if self.tokenizer.is_fast:
            encoded = self.tokenizer(sentence, add_special_tokens=False, return_offsets_mapping=True, verbose=False)
            if len(encoded["input_ids"]) <= limit:
                return sentence
            return sentence[: encoded["offset_mapping"][limit - 1][1]]
        ids = self.tokenizer(sentence, add_special_tokens=False, verbose=False)["input_ids"]
        return sentence if len(ids) <= limit else self.tokenizer.decode(ids[:limit])

    def _fill(self, sentence: str) -> tuple[list[int], int]:
        """(ids of the filled, stripped template framed by the special ids, number of tokens overlapping the
        sentence)."""
        filled = self.template_prefix + sentence + self.template_suffix
        lead = len(filled) - len(filled.lstrip())
        start = len(self.template_prefix) - lead
        encoded = self.tokenizer(filled.strip(), add_special_tokens=False,
                                 return_offsets_mapping=self.tokenizer.is_fast)
        spans = encoded.get("offset_mapping") or [(0, 0)] * len(encoded["input_ids"])
        in_sentence = sum(1 for first, end in spans if first < start + len(sentence) and end > start)
        return [*self.special_prefix, *encoded["input_ids"], *self.special_suffix], in_sentence

    def decoder_row(self, sentence: str) -> tuple[list[int], int]:
        """Only the sentence is cut (first, then the sentence rule, then the template): the template's last token
        always stays; a merge across the template/sentence boundary that overflows cuts one more sentence token."""
        limit = self.max_sentence_tokens
        while True:
            ids, length = self._fill(apply_sentence_rule(self._cut(sentence, limit), self.record["sentence_rule"]))
            if len(ids) <= self.max_seq_length or limit <= 1:
                return ids, length
            limit -= len(ids) - self.max_seq_length

    def llm2vec_row(self, sentence: str) -> tuple[list[int], int]:
        """(ids, n pooled): the sentence cut to its first tokens, the end text appended to it right-stripped,
        `instruction.strip() + " " + text` tokenized whole with special tokens (the sentence cut further while the
        row overflows); the last n tokens are pooled, n = the text's own token count (every token when the
        instruction is pooled too)."""
        spec, limit = self.llm2vec, self.max_sentence_tokens
        instruction = spec["instruction"].strip()
        while True:
            text = self._cut(sentence, limit)
            if spec["eos_suffix"] is not None:
                text = text.rstrip() + spec["eos_suffix"]
            ids = self.tokenizer(f"{instruction} {text}" if instruction else text)["input_ids"]
            if len(ids) <= self.max_seq_length or limit <= 1:
                break
            limit -= len(ids) - self.max_seq_length
        own = len(self.tokenizer(text, add_special_tokens=False)["input_ids"]) if text else 0
        return ids, min(own, len(ids)) if spec["skip_instruction"] else len(ids)

    def decoder_preprocess(self, texts: list[str]) -> dict[str, torch.Tensor]:
        built = [self.llm2vec_row(text) if self.llm2vec else self.decoder_row(text) for text in texts]
        rows, lengths = [row for row, _ in built], [length for _, length in built]
        width = max((len(row) for row in rows), default=0)
        input_ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
        pooled = torch.zeros(len(rows), dtype=torch.long)
        span = torch.zeros((len(rows), width), dtype=torch.long)  # LLM2Vec: the pooled tokens, the row's last n
        for index, row in enumerate(rows):
            start = width - len(row) if self.padding_side == "left" else 0
            input_ids[index, start : start + len(row)] = torch.tensor(row)
            attention_mask[index, start : start + len(row)] = 1
            pooled[index] = start + len(row) - 1  # the row's last token: the template's own last token
            span[index, start + len(row) - lengths[index] : start + len(row)] = 1
        return {"input_ids": input_ids, "attention_mask": attention_mask,
                "position_ids": (attention_mask.cumsum(1) - 1).clamp(min=0), "pooled_positions": pooled,
                "sentence_lengths": torch.tensor(lengths, dtype=torch.long), "pooled_span": span}

    def tokenize(self, texts, **kwargs) -> dict[str, torch.Tensor]:  # sentence-transformers 5.x entry point
        return self.preprocess(texts, **kwargs)

    def template_index(self, lengths: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Per position: is it a template token, and which one (k over prefix then suffix); found by offset."""
        prefix, suffix = len(self.prefix_ids), len(self.suffix_ids)
        positions = torch.arange(width, device=lengths.device).unsqueeze(0)
        start = 1 + prefix + lengths.unsqueeze(1)
        in_prefix = (positions >= 1) & (positions <= prefix)
        in_suffix = (positions >= start) & (positions < start + suffix)
        index = torch.where(in_prefix, positions - 1, positions - start + prefix)
        return in_prefix | in_suffix, index.clamp(0, max(prefix + suffix - 1, 0))

    # -- forward (encoder/forward.py, poolers/) -------------------------------------------------------------------

    def run(self, input_ids, attention_mask, template, index, position_ids=None) -> torch.Tensor:
        inputs = {"attention_mask": attention_mask, "position_ids": position_ids}
        if self.soft_vectors is not None:
            embeds = self.model.get_input_embeddings()(input_ids)
            soft = self.soft_vectors.to(embeds.dtype)[index]
            use_soft = (template & ~self.template_is_mask[index]).unsqueeze(-1)
            inputs["inputs_embeds"] = torch.where(use_soft, soft, embeds)
        else:
            inputs["input_ids"] = input_ids
        last = self.layer in (-1, self.model.config.num_hidden_layers)
        out = self.model(**inputs, output_hidden_states=not last)
        return out.last_hidden_state if last else out.hidden_states[self.layer]

    @staticmethod
    def masked_mean(states: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        weights = weights.to(states.dtype)
        return (states * weights.unsqueeze(-1)).sum(1) / weights.sum(1, keepdim=True).clamp_min(1e-9)

    def template_bias(self, lengths: torch.Tensor) -> torch.Tensor:
        """[MASK] state of `[CLS] prefix suffix [SEP]` per row, positions after the prefix shifted by +n."""
        unique, inverse = torch.unique(lengths, return_inverse=True)
        ids = [self.tokenizer.cls_token_id, *self.prefix_ids, *self.suffix_ids, self.tokenizer.sep_token_id]
        width, head = len(ids), 1 + len(self.prefix_ids)
        positions = torch.arange(width, device=lengths.device).unsqueeze(0).expand(len(unique), -1)
        positions = torch.where(positions >= head, positions + unique.unsqueeze(1), positions) + self.position_base
        input_ids = torch.tensor(ids, device=lengths.device).unsqueeze(0).expand(len(unique), -1)
        template = torch.zeros_like(input_ids, dtype=torch.bool)
        template[:, 1:-1] = True
        index = (torch.arange(width, device=lengths.device) - 1).clamp(0, width - 3)
        index = index.unsqueeze(0).expand(len(unique), -1)
        states = self.run(input_ids, torch.ones_like(input_ids), template, index, positions)
        bias = self.masked_mean(states, template & (input_ids == self.tokenizer.mask_token_id))
        return bias[inverse]

    def pooled_masks(self, mask_token: torch.Tensor) -> torch.Tensor:
        """poolers/mask.py `which_mask`: every [MASK] of a row, or only its `which_mask`-th (-1 the last)."""
        if self.which_mask is None:
            return mask_token
        rank = mask_token.long().cumsum(1)
        wanted = self.which_mask + 1 if self.which_mask >= 0 else rank[:, -1:] + self.which_mask + 1
        return mask_token & (rank == wanted)

    def forward(self, features: dict[str, torch.Tensor], **kwargs) -> dict[str, torch.Tensor]:
        if self.decoder:
            return self.decoder_forward(features)
        input_ids, attention_mask = features["input_ids"], features["attention_mask"]
        lengths = features["sentence_lengths"]
        template, index = self.template_index(lengths, input_ids.shape[1])
        states = self.run(input_ids, attention_mask, template, index)
        if self.pooler_name == "avg":
            embedding = self.masked_mean(states, attention_mask)
        elif self.pooler_name == "cls":
            embedding = states[:, 0] if self.head is None else self.head(states[:, 0])
        else:
            masks = self.pooled_masks(template & (input_ids == self.tokenizer.mask_token_id))
            embedding = self.masked_mean(states, masks)
            head = self.head if self.head is not None else nn.Identity()
            if not self.denoise:
                embedding = head(embedding)
            elif self.head_after_denoise:
                embedding = head(embedding - self.template_bias(lengths))
            else:
                embedding = head(embedding) - head(self.template_bias(lengths))
        features.update(token_embeddings=states, sentence_embedding=embedding)
        return features

    def decoder_forward(self, features: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """hidden_states[layer] (the last one is after the final norm) at each row's pooled position; LLM2Vec: of
        the bidirectional forward, pooled over the span as its pooling mode says."""
        mask = {"attention_mask": features["attention_mask"]}
        if self.llm2vec:
            from transformers.masking_utils import create_bidirectional_mask

            plain = features["attention_mask"]
            stub = torch.empty((*plain.shape, 0), dtype=self.model.dtype, device=plain.device)
            mask = {"attention_mask": create_bidirectional_mask(self.model.config, stub, plain,
                                                                allow_is_bidirectional_skip=False),
                    "is_causal": False}
        out = self.model(input_ids=features["input_ids"], position_ids=features["position_ids"], use_cache=False,
                         output_hidden_states=True, **mask)
        states = out.hidden_states[self.layer]
        rows = torch.arange(states.shape[0], device=states.device)
        embedding = states[rows, features["pooled_positions"]]
        mode = self.llm2vec["pooling_mode"] if self.llm2vec else "last_token"
        if mode == "mean":
            embedding = self.masked_mean(states, features["pooled_span"])
        elif mode == "weighted_mean":  # weights 1..n over the span, in order
            ranks = (features["pooled_span"].cumsum(1) * features["pooled_span"]).to(states.dtype)
            embedding = (states * (ranks / ranks.sum(1, keepdim=True).clamp_min(1)).unsqueeze(-1)).sum(1)
        elif mode == "bos_token":  # the row's first real BOS token
            bos = (features["input_ids"] == self.tokenizer.bos_token_id) & features["attention_mask"].bool()
            embedding = states[rows, bos.long().argmax(1)]
        features.update(token_embeddings=states, sentence_embedding=embedding)
        return features
