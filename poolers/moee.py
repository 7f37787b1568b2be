"""MoEE (Li & Zhou, ICLR 2025, "Your Mixture-of-Experts LLM Is Secretly an Embedding Model For Free"): the routing
weights (RW) of a mixture-of-experts decoder's routers as an embedding, the hidden state (HS), and their combination,
all from ONE forward of the prompt.

Followed: tianyi-lab/MoE-Embedding@f80bebd7eb5b04115308b7324c7884dfc15eca35, `moee.py` `MOEE.encode` (prompt, HS, RW,
standardisation), `models/modeling_olmoe.py` / `models/modeling_qwen2_moe.py` (what RW is made of) and
`mteb/evaluation/evaluators/STSEvaluator.py` (the similarity sum). For each sentence the official code builds
`prompt.replace('*sent 0*', s)` (embed_method `none`: `"*sent 0*"`; `prompteol`: PromptEOL), tokenizes the batch
left-padded and pools the LAST position:

* HS = `hidden_states[-1][:, -1]` (after the final norm);
* RW = the concatenation over the MoE blocks, in order, of the router's output at the last position. In the official
  OLMoE and Qwen2-MoE modeling files that output is the router LOGITS (`sent_emb = router_logits.view(...)`, before
  the softmax the experts are weighted with); in its DeepSeek-MoE file it is the softmax. We keep the logits
  (`routing=logits`) and offer the softmax (`routing=softmax`, the paper's g = softmax(·)).
* RW and the MoEE concatenation are standardised per dimension over the sentences of the encode batch,
  `(x − mean₀) / (std₀ + 1e-8)` with the unbiased std, and NaN (a batch of one sentence) becomes 0: an embedding that
  depends on the other sentences of its batch. `standardize=chunk` reproduces it over consecutive chunks of
  `chunk_size` sentences in the order `Encoder.embed` receives them; `standardize=none` is the clean variant
  (no standardisation; fit `zscore` post-processing on a named corpus instead). HS alone is not standardised.
* MoEE (sum), `--similarity_ensemble`: the score is cos(HS₁, HS₂) + w·cos(RW₁, RW₂), both parts standardised. As an
  embedding, e = [ĥ, √w·r̂] with ĥ, r̂ the unit-normalised parts: cos(e₁, e₂) = (cos_HS + w·cos_RW) / (1 + w), the
  official score divided by the constant 1 + w (the same ranking, so the same Spearman).
"""

from __future__ import annotations

import math
import typing
from collections.abc import Mapping
from typing import Literal

import numpy as np
import torch

from promptemb.common.errors import ConfigError
from promptemb.encoder.decoder import last_positions
from promptemb.encoder.inputs import InputForm
from promptemb.encoder.outputs import EncoderOutput
from promptemb.encoder.template import Template
from promptemb.poolers.base import Needs, Pooler

PAPER = "Li & Zhou 2025, MoEE (tianyi-lab/MoE-Embedding@f80bebd)"
#: the official prompts (`--embed_method`): `none` (the README's default) quotes the sentence; `prompteol` is PromptEOL
MOEE_NONE = '"[X]"'
MOEE_PROMPTEOL = 'This sentence : "[X]" means in one word:"'
#: transformers model types whose routers the official code reads and that transformers 5 has a class for
#: (DeepSeek-MoE 16B needs its own remote modeling code; transformers has DeepSeek-V2/V3 only)
MOE_FAMILIES = ("olmoe", "qwen2_moe")

Embedding = Literal["hs", "rw", "concat", "sum"]
Routing = Literal["logits", "softmax"]
Standardize = Literal["chunk", "none"]
EMBEDDINGS = typing.get_args(Embedding)
ROUTINGS = typing.get_args(Routing)
STANDARDIZATIONS = typing.get_args(Standardize)
#: the official `(x - mean) / (std + 1e-8)`
STD_EPSILON = 1e-8


def moe_layers(config) -> list[int]:
    """0-based indices of the blocks with a router: every block of OLMoE; Qwen2-MoE's sparse blocks (not in
    `mlp_only_layers`, every `decoder_sparse_step`-th), the blocks whose router logits transformers records."""
    depth = int(config.num_hidden_layers)
    if config.model_type == "qwen2_moe":
        dense = set(getattr(config, "mlp_only_layers", None) or [])
        step = int(getattr(config, "decoder_sparse_step", 1) or 1)
        if int(config.num_experts) <= 0:
            return []
        return [i for i in range(depth) if i not in dense and (i + 1) % step == 0]
    return list(range(depth))


def check_moe_model(name: str, config) -> None:
    """MoEE reads router logits: refuse a dense model, or an MoE family not tested against the official code."""
    model_type = getattr(config, "model_type", type(config).__name__)
    if model_type not in MOE_FAMILIES:
        raise ConfigError(f"pooler {name!r} reads the routers of a mixture-of-experts decoder, but the model is "
                          f"{model_type!r}; MoEE runs on {', '.join(MOE_FAMILIES)} (OLMoE, Qwen-MoE) models")
    if not moe_layers(config):
        raise ConfigError(f"pooler {name!r}: this {model_type} model has no mixture-of-experts block "
                          "(num_experts=0 or every block in mlp_only_layers)")


def standardize_chunks(values: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """The official per-batch standardisation over consecutive chunks of `chunk_size` rows: `(x - mean(0)) /
    (std(0) + 1e-8)` with the unbiased std; NaN (a chunk of one row) becomes 0 as the official `torch.where`."""
    chunks = []
    for start in range(0, values.shape[0], chunk_size):
        chunk = values[start : start + chunk_size]
        # a one-row chunk: the unbiased std is NaN (0/0), as the official code's; written out so torch does not warn
        std = chunk.std(dim=0, keepdim=True) if chunk.shape[0] > 1 else torch.full_like(chunk[:1], math.nan)
        chunks.append((chunk - chunk.mean(dim=0, keepdim=True)) / (std + STD_EPSILON))
    joined = torch.cat(chunks)
    return torch.where(torch.isnan(joined), torch.zeros_like(joined), joined)


def unit(values: torch.Tensor) -> torch.Tensor:
    """Rows divided by their L2 norm; a zero row stays zero (as sklearn's `normalize` in `paired_cosine_distances`)."""
    return values / values.norm(dim=1, keepdim=True).clamp_min(1e-12)


class MoEEPart(Pooler):
    """One raw part of MoEE read from the forward, per sentence (no standardisation): `hs`, the hidden state at
    `layer` of the last token, or `rw`, the routers' outputs at the last token concatenated over the MoE blocks."""

    def __init__(self, name: str, part: str, layer: int, routing: str, form: InputForm, owner: MoEEPooler):
        super().__init__(name)
        self.owner = owner  # the encoder checks parts, not their owner: the check (and refusal) is the owner's
        self.part = part
        self.layer = layer
        self.routing = routing
        self.form = form

    @property
    def needs(self) -> Needs:
        if self.part == "hs":
            return Needs(layers=(self.layer,), templated=True, decoder=True)
        return Needs(templated=True, decoder=True, router_logits=True)

    def input_form(self) -> InputForm:
        return self.form

    def check_model(self, config) -> None:
        self.owner.check_model(config)

    def __call__(self, out: EncoderOutput) -> torch.Tensor:
        last = last_positions(out.attention_mask)
        rows = torch.arange(last.shape[0], device=last.device)
        if self.part == "hs":
            return out.layer(self.layer)[rows, last]
        if not out.router_logits:
            raise ConfigError(f"pooler {self.name!r}: the model recorded no router logits")
        per_block = [logits[rows, last] for logits in out.router_logits]
        if self.routing == "softmax":
            per_block = [torch.softmax(logits.float(), dim=-1) for logits in per_block]
        return torch.cat(per_block, dim=1)

    def arguments(self) -> dict:
        return {"part": self.part, "layer": self.layer, "routing": self.routing}


class MoEEPooler(Pooler):
    """MoEE at the prompt's last token T (default prompt `"[X]"`): HS = h⁽ˡ⁾_T (l = −1, after the final norm), RW =
    [g₁(T); …; g_K(T)] the router logits of the K mixture-of-experts blocks (their softmax with routing=softmax);
    embedding `hs`: e = HS; `rw`: e = S(RW); `concat`: e = S([HS, RW]); `sum`: e = [ĥ, √w·r̂], ĥ = S(HS)/‖S(HS)‖,
    r̂ = S(RW)/‖S(RW)‖, so cos(e₁, e₂) = (cos_HS + w·cos_RW)/(1 + w). S = the official per-batch (x − mean)/(std +
    1e-8) over consecutive chunks of `chunk_size` sentences (standardize=chunk), or nothing (standardize=none).

    The module docstring says where each step comes from in the official code and what it does surprisingly."""

    def __init__(self, name: str = "moee", embedding: Embedding = "concat", template: str = MOEE_NONE,
                 sentence_rule: str = "moee", layer: int = -1, routing: Routing = "logits",
                 standardize: Standardize | None = None, chunk_size: int = 128, weight: float = 1.0,
                 paper: str = PAPER):
        super().__init__(name)
        if standardize is None:  # the official choice: HS alone is never standardised, RW and the combinations are
            standardize = "none" if embedding == "hs" else "chunk"
        for key, value, valid in (("embedding", embedding, EMBEDDINGS), ("routing", routing, ROUTINGS),
                                  ("standardize", standardize, STANDARDIZATIONS)):
            if value not in valid:
                raise ConfigError(f"pooler {name!r}: unknown {key} {value!r}; valid: {', '.join(valid)}")
        if int(chunk_size) < 1:
            raise ConfigError(f"pooler {name!r}: chunk_size must be >= 1 (the official encode batch size), got "
                              f"{chunk_size}")
        if not math.isfinite(float(weight)) or float(weight) < 0:
            raise ConfigError(f"pooler {name!r}: weight must be a finite number >= 0 (the official "
                              f"--similarity_weights of RW), got {weight}")
        if embedding == "hs" and (routing != "logits" or standardize != "none"):
            raise ConfigError(f"pooler {name!r}: embedding=hs is the plain hidden state (the official HS mode is not "
                              "standardised and has no routing); drop routing/standardize")
        if embedding != "sum" and float(weight) != 1.0:
            raise ConfigError(f"pooler {name!r}: weight weighs RW's similarity in embedding=sum (moee_sum), not in "
                              f"embedding={embedding}")
        if embedding == "rw" and layer != -1:
            raise ConfigError(f"pooler {name!r}: embedding=rw reads the routers of every MoE block, not a layer's "
                              f"hidden state; drop the layer {layer}")
        self.embedding = embedding
        self.template = Template(template)
        self.sentence_rule = sentence_rule
        self.layer = layer
        self.routing = routing
        self.standardize = standardize
        self.chunk_size = int(chunk_size)
        self.weight = float(weight)
        self.paper = paper
        self.router_layers: list[int] | None = None  # the MoE blocks, once the model's config is known
        self._parts = {part: MoEEPart(f"{name}#{part}", part, layer, routing, self.input_form(), self)
                       for part in (("hs",) if embedding == "hs" else ("rw",) if embedding == "rw"
                                    else ("hs", "rw"))}

    @property
    def needs(self) -> Needs:
        return Needs(layers=(self.layer,) if "hs" in self._parts else (), templated=True, decoder=True,
                     router_logits="rw" in self._parts)

    def input_form(self) -> InputForm:
        return InputForm(self.template, self.sentence_rule, None)

    def check_model(self, config) -> None:
        check_moe_model(self.name, config)
        self.router_layers = moe_layers(config)

    def parts(self) -> list[Pooler]:
        # named after this pooler's current name: renamed copies (moee@2) must not share part names
        for part in self._parts.values():
            part.name = f"{self.name}#{part.part}"
        return list(self._parts.values())

    def __call__(self, out: EncoderOutput) -> torch.Tensor:
        raise TypeError(f"pooler {self.name!r} combines its parts over all sentences (standardisation); embed it "
                        "through Encoder.embed")

    def combine(self, embeddings: Mapping[str, np.ndarray]) -> np.ndarray:
        """The parts of all N sentences (in `Encoder.embed`'s order) → the official embedding."""
        parts = {key: torch.from_numpy(np.asarray(embeddings[part.name], dtype=np.float32))
                 for key, part in self._parts.items()}
        chunked = self.standardize == "chunk"
        if self.embedding == "hs":  # the official HS mode is never standardised
            result = parts["hs"]
        elif self.embedding in ("rw", "concat"):
            joined = parts["rw"] if self.embedding == "rw" else torch.cat([parts["hs"], parts["rw"]], dim=1)
            result = standardize_chunks(joined, self.chunk_size) if chunked else joined
        else:
            hs, rw = ((standardize_chunks(parts[key], self.chunk_size) if chunked else parts[key])
                      for key in ("hs", "rw"))
            result = torch.cat([unit(hs), math.sqrt(self.weight) * unit(rw)], dim=1)
        return result.numpy().astype(np.float32)

    def arguments(self) -> dict:
        record = {"paper": self.paper, "embedding": self.embedding, "template": self.template.text,
                  "sentence_rule": self.sentence_rule, "token": "last",
                  "standardize": self.standardize if self.embedding != "hs" else "none"}
        if self.embedding != "rw":
            record["layer"] = self.layer
        if self.embedding != "hs":
            record["routing"] = self.routing
            record["router_layers"] = ("every mixture-of-experts block, in order" if self.router_layers is None
                                       else self.router_layers)
        if self.standardize == "chunk" and self.embedding != "hs":
            record["chunk_size"] = self.chunk_size
        if self.embedding == "sum":
            record.update(weight=self.weight, score="(cos_HS + weight*cos_RW) / (1 + weight)")
        return record
