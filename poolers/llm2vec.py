"""LLM2Vec (BehnamGhader et al., COLM 2024, "LLM2Vec: Large Language Models Are Secretly Powerful Text Encoders"):
a decoder read as an encoder, with the causal mask removed and one of four poolings over the last layer.

Followed: McGill-NLP/llm2vec 0.2.3 (= 312adcfb578b4023bfc9d3bcc83b6b87448ab059), `llm2vec/llm2vec.py`
(`LLM2Vec.encode`, `_convert_to_str`, `prepare_for_tokenization`, `tokenize`, `get_pooling`) and
`llm2vec/models/bidirectional_{llama,mistral,qwen2,gemma}.py`. For a sentence x and an instruction I (none by
default):

* input: `I.strip() + " " + x` (x alone without I), tokenized whole with the tokenizer's special tokens (`<s>` for
  LLaMA); the `eos_token` mode right-strips x and appends an end text first (official: `" </s>"` for LLaMA and
  Mistral configs, whatever their tokenizer's EOS is; `"<eos>"` for Gemma (1) configs; `"<|endoftext|>"` for
  Qwen2), `eos=tokenizer` appends the tokenizer's own EOS token instead;
* pooled span P: the last n positions, n = the token count of x (plus the end text) tokenized ALONE without special
  tokens (the official `embed_mask`): the instruction and `<s>` are never pooled, with or without an instruction;
  `skip_instruction=false` pools every real token;
* h = `last_hidden_state` (after the final norm; `layer` -1) of the bidirectional model (`bidirectional=false`: the
  causal model, LLM2Vec's "uni" baseline);
* `mean`: e = (1/|P|) Σ_{t∈P} h_t; `weighted_mean`: e = Σ_k k·h_{P_k} / Σ_k k (k = 1..|P| in order, later tokens
  weigh more); `eos_token`, `last_token`: e = h_T, the last real token (the end text's last token for `eos_token`);
  `bos_token`: e = h at the tokenizer's BOS token (`<s>`, first in the row; the official
  `h[input_ids == bos_token_id]`, one row per BOS, which is one per sentence unless the text itself holds the BOS
  text: here the first one is pooled). A tokenizer that writes no BOS is refused.

`official_pool` is `get_pooling` as the official training scripts reach it (lightning_modules/llm2vec.py).
"""

from __future__ import annotations

from dataclasses import replace

import torch

from promptemb.common.errors import ConfigError
from promptemb.encoder.bidirectional import check_bidirectional_family
from promptemb.encoder.decoder import last_positions, special_frame
from promptemb.encoder.decoder_forms import DecoderForm, LLM2VecInput
from promptemb.encoder.inputs import POOLED, InputForm
from promptemb.encoder.outputs import EncoderOutput
from promptemb.poolers.base import Needs, Pooler, masked_mean

PAPER = "BehnamGhader et al. 2024, LLM2Vec (McGill-NLP/llm2vec 0.2.3)"
#: `LLM2Vec.get_pooling`'s modes
POOLING_MODES = ("mean", "weighted_mean", "eos_token", "last_token", "bos_token")
#: the `eos_token` mode's end text per model type, as `LLM2Vec.prepare_for_tokenization` writes it (keyed there on the
#: config class: LlamaConfig and MistralConfig append " </s>" even when their tokenizer's EOS is another token)
OFFICIAL_EOS = {"llama": " </s>", "mistral": " </s>", "qwen2": "<|endoftext|>", "gemma": "<eos>"}
EOS_CHOICES = ("official", "tokenizer")
#: the constructor arguments besides name and layer that rebuild a pooling (`LLM2VecPooler.settings`)
SETTINGS = ("pooling_mode", "instruction", "eos", "skip_instruction")


class LLM2VecPooler(Pooler):
    """e = pool(h⁽ˡ⁾ over the sentence's span P) of the bidirectional decoder on `instruction + " " + sentence`:
    mean = (1/|P|) Σ_{t∈P} h_t, weighted_mean = Σ_k k·h_{P_k} / Σ_k k, eos_token / last_token = h_T (the last real
    token; eos_token appends its end text first), bos_token = h at `<s>`. The instruction and `<s>` are never in P.

    `pooling_mode` one of mean, weighted_mean, eos_token, last_token, bos_token; `instruction` written before the
    sentence;
    `eos` the `eos_token` mode's end text (`official` per family or the tokenizer's EOS); `bidirectional` false runs
    the causal model; `skip_instruction` false pools every real token (see the module docstring)."""

    def __init__(self, name: str = "llm2vec", pooling_mode: str = "mean", instruction: str = "", layer: int = -1,
                 bidirectional: bool = True, skip_instruction: bool = True, eos: str = "official",
                 paper: str = PAPER):
        super().__init__(name)
        if pooling_mode not in POOLING_MODES:
            raise ConfigError(f"pooler {name!r}: LLM2Vec has no pooling mode {pooling_mode!r}; valid: "
                              f"{', '.join(POOLING_MODES)}")
        if eos not in EOS_CHOICES:
            raise ConfigError(f"pooler {name!r}: unknown eos {eos!r}; valid: {', '.join(EOS_CHOICES)}")
        self.pooling_mode = pooling_mode
        self.bos_id: int | None = None  # bos_token: the tokenizer's BOS id (`bind_encoder`)
        self.layer = layer
        self.eos = eos
        self.paper = paper
        self.decoder = DecoderForm(llm2vec=LLM2VecInput(instruction, None, skip_instruction),
                                   bidirectional=bidirectional)

    @property
    def needs(self) -> Needs:
        return Needs(layers=(self.layer,), templated=True, decoder=True, bidirectional=self.decoder.bidirectional)

    def input_form(self) -> InputForm:
        return InputForm(None, "none", None, self.decoder)

    def check_model(self, config) -> None:
        if self.decoder.bidirectional:
            check_bidirectional_family(f"pooler {self.name!r}", config)

    def bind_encoder(self, encoder) -> None:
        """The `eos_token` mode's end text for this model (its family's official text or its tokenizer's EOS); the
        `bos_token` mode's BOS id."""
        if self.pooling_mode == "bos_token":
            self.bos_id = bos_token_id(self.name, encoder.tokenizer)
        if self.pooling_mode != "eos_token":
            return
        self.decoder = replace(self.decoder, llm2vec=replace(
            self.decoder.llm2vec, suffix=end_text(self.name, self.eos, encoder.transformer.config, encoder.tokenizer)))

    def __call__(self, out: EncoderOutput) -> torch.Tensor:
        return pool(out.layer(self.layer), (out.roles == POOLED).long(), out.attention_mask, self.pooling_mode,
                    out.input_ids, self.bos_id)

    def arguments(self) -> dict:
        return {"pooling_mode": self.pooling_mode, "layer": self.layer, "eos": self.eos, "paper": self.paper,
                **self.decoder.describe()}

    def settings(self) -> dict:
        """The constructor arguments besides name and layer that rebuild this pooling (an export records them)."""
        form = self.decoder.llm2vec
        return {"pooling_mode": self.pooling_mode, "instruction": form.instruction, "eos": self.eos,
                "skip_instruction": form.skip_instruction}


def end_text(who: str, eos: str, config, tokenizer) -> str:
    """The text the `eos_token` mode appends: the official per-family text, or the tokenizer's EOS token."""
    if eos == "tokenizer":
        if tokenizer.eos_token is None:
            raise ConfigError(f"pooler {who!r}: eos=tokenizer, but the tokenizer has no EOS token; use eos=official")
        return tokenizer.eos_token
    model_type = getattr(config, "model_type", None)
    if model_type not in OFFICIAL_EOS:
        raise ConfigError(f"pooler {who!r}: the official eos_token text is defined for "
                          f"{', '.join(OFFICIAL_EOS)} models, not {model_type!r}; use eos=tokenizer")
    return OFFICIAL_EOS[model_type]


def bos_token_id(who: str, tokenizer) -> int:
    """The id the `bos_token` mode pools: the tokenizer's BOS, which it must write in front of every text."""
    if tokenizer.bos_token_id is None or tokenizer.bos_token_id not in special_frame(tokenizer)[0]:
        raise ConfigError(f"pooler {who!r}: pooling_mode bos_token pools the BOS token, but the tokenizer writes none "
                          "in front of a text; use another pooling mode")
    return int(tokenizer.bos_token_id)


def bos_positions(input_ids: torch.Tensor, attention_mask: torch.Tensor, bos_id: int) -> torch.Tensor:
    """[B] index of each row's first real BOS token, whichever side the padding is on."""
    return ((input_ids == bos_id) & attention_mask.bool()).long().argmax(1)


def pool(states: torch.Tensor, pooled: torch.Tensor, attention_mask: torch.Tensor, mode: str,
         input_ids: torch.Tensor | None = None, bos_id: int | None = None) -> torch.Tensor:
    """LLM2Vec's `get_pooling` for any padding side: `pooled` [B, T] marks the pooled span P of each row
    (`bos_token` reads the ids)."""
    if mode == "mean":
        return masked_mean(states, pooled)
    if mode == "weighted_mean":
        ranks = pooled.cumsum(1) * pooled  # 1..|P| over the span, in order
        weights = ranks.to(states.dtype) / ranks.sum(1, keepdim=True).clamp_min(1).to(states.dtype)
        return (states * weights.unsqueeze(-1)).sum(1)
    rows = torch.arange(states.shape[0], device=states.device)
    if mode == "bos_token":
        return states[rows, bos_positions(input_ids, attention_mask, bos_id)]
    return states[rows, last_positions(attention_mask)]


def official_pool(states: torch.Tensor, embed_mask: torch.Tensor, input_ids: torch.Tensor,
                  attention_mask: torch.Tensor, mode: str, bos_id: int | None) -> torch.Tensor:
    """`LLM2Vec.get_pooling` as written, on LEFT-padded rows (it asserts left padding): n = the row's `embed_mask`
    count (`skip_instruction` makes it the attention mask); mean = the mean of the last n positions, where n = 0
    takes `h[i, -0:]`, the WHOLE row (padding and `<s>` included); weighted_mean = weights 1..n on the last n
    positions, none when n = 0 (a zero vector); eos_token, last_token = the last position; bos_token = the BOS
    position (the first, see the module docstring)."""
    width = states.shape[1]
    lengths = embed_mask.sum(1, keepdim=True)
    positions = torch.arange(width, device=states.device).unsqueeze(0)
    if mode == "mean":
        return masked_mean(states, (positions >= width - lengths) | (lengths == 0))
    if mode == "weighted_mean":
        ranks = (positions - (width - lengths) + 1).clamp_min(0).to(states.dtype)  # 1..n over the last n
        return (states * (ranks / ranks.sum(1, keepdim=True).clamp_min(1e-9)).unsqueeze(-1)).sum(1)
    if mode == "bos_token":
        rows = torch.arange(states.shape[0], device=states.device)
        return states[rows, bos_positions(input_ids, attention_mask, bos_id)]
    return states[:, -1]
