"""sentence-transformers module of a promptemb export: prompt template at the token level + [MASK] / avg pooling.

Copied by export.py into every export directory as `promptemb_st_module.py` and loaded with
`SentenceTransformer(DIR, trust_remote_code=True)`. The directory is also a plain Hugging Face model directory
(config.json + weights + tokenizer); this module reads the `promptemb` block of its config.json.

WHY THIS FILE DUPLICATES FRAMEWORK CODE: an export must load where promptemb is not installed, so this file imports
only torch, transformers and sentence-transformers. It re-implements, minimally, the framework's
* encoder/inputs.py            `[CLS] prefix sentence[:max_sentence_tokens] suffix [SEP]` (template ids recorded),
                               sentence rules, [MASK] positions found by offset (never by token search);
* encoder/forward.py           template bias for denoising: [MASK] state of `[CLS] prefix suffix [SEP]` with the
                               position ids after the prefix shifted by the sentence length n;
* poolers/mask.py, mean.py     [MASK] mean (optionally through the MLM-transform head, minus the bias) and `avg`;
* lightning_modules/soft_template.py   OptiPrompt's soft template written into `inputs_embeds`.
tests/test_export.py compares this file with those on tiny BERTs (many lengths, truncation, padding): change them
together.
"""

from __future__ import annotations

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
    return sentence


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
        self.model = AutoModel.from_pretrained(model_dir, **(model_kwargs or {}))
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.prefix_ids, self.suffix_ids = list(record["prefix_ids"]), list(record["suffix_ids"])
        self.max_seq_length = int(record["max_length"])
        self.max_sentence_tokens = int(record["max_sentence_tokens"])
        pooler = record["pooler"]
        self.pooler_name, self.layer, self.denoise = pooler["name"], int(pooler["layer"]), bool(pooler["denoise"])
        hidden = self.model.config.hidden_size
        self.head, self.head_after_denoise = None, False
        if pooler.get("head") and self.pooler_name == "mask":
            if pooler["head"].get("type") == "tanh_mlp":
                self.head, self.head_after_denoise = TanhMLPHead(hidden), bool(pooler["head"].get("after_denoise"))
            else:
                self.head = MLMTransformHead(hidden, pooler["head"]["activation"], pooler["head"]["layer_norm_eps"])
            self.head.load_state_dict(load_file(os.path.join(model_dir, pooler["head"]["file"])))
        self.soft_vectors = None
        if record.get("soft_template"):
            vectors = load_file(os.path.join(model_dir, record["soft_template"]["file"]))["vectors"]
            self.soft_vectors = nn.Parameter(vectors, requires_grad=False)
        template_ids = torch.tensor(self.prefix_ids + self.suffix_ids, dtype=torch.long)
        self.register_buffer("template_is_mask", template_ids == self.tokenizer.mask_token_id, persistent=False)
        padding_idx = getattr(getattr(self.model, "embeddings", None), "padding_idx", None)
        self.position_base = 0 if padding_idx is None else int(padding_idx) + 1

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
        self.model.config.promptemb = self.record
        self.model.save_pretrained(output_path, safe_serialization=safe_serialization)
        self.tokenizer.save_pretrained(output_path)
        if self.head is not None:
            save_file({k: v.contiguous() for k, v in self.head.state_dict().items()},
                      os.path.join(output_path, self.record["pooler"]["head"]["file"]))
        if self.soft_vectors is not None:
            save_file({"vectors": self.soft_vectors.detach().contiguous()},
                      os.path.join(output_path, self.record["soft_template"]["file"]))

    def get_embedding_dimension(self) -> int:
        return int(self.model.config.hidden_size)

    get_sentence_embedding_dimension = get_embedding_dimension  # sentence-transformers 5.x name

    # -- inputs (encoder/inputs.py) -------------------------------------------------------------------------------

    def preprocess(self, inputs, prompt: str | None = None, **kwargs) -> dict[str, torch.Tensor]:
        texts = [prompt + text if prompt else text for text in inputs]
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

    def forward(self, features: dict[str, torch.Tensor], **kwargs) -> dict[str, torch.Tensor]:
        input_ids, attention_mask = features["input_ids"], features["attention_mask"]
        lengths = features["sentence_lengths"]
        template, index = self.template_index(lengths, input_ids.shape[1])
        states = self.run(input_ids, attention_mask, template, index)
        if self.pooler_name == "avg":
            embedding = self.masked_mean(states, attention_mask)
        else:
            embedding = self.masked_mean(states, template & (input_ids == self.tokenizer.mask_token_id))
            head = self.head if self.head is not None else nn.Identity()
            if not self.denoise:
                embedding = head(embedding)
            elif self.head_after_denoise:
                embedding = head(embedding - self.template_bias(lengths))
            else:
                embedding = head(embedding) - head(self.template_bias(lengths))
        features.update(token_embeddings=states, sentence_embedding=embedding)
        return features
