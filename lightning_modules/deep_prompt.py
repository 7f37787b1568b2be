"""Deep continuous prompts (P-tuning v2 prefixes, as DCPCSE trains them): trainable keys and values prepended to the
self-attention of every layer of an unmodified BERT / RoBERTa.

DCPCSE (Jiang et al. 2022, "Improved Universal Sentence Embeddings with Prompt-based Contrastive Learning and
Energy-based Learning"; official code YJiangcm/DCPCSE, promcse/models.py at 4b319380fa13d018811dd0631bcbeee838c3218e)
builds `past_key_values` from a `PrefixEncoder` and hands them to transformers 4.2.1's `BertModel.forward`. There, with
P prefix positions,

* every layer's self-attention attends over [prefix keys; token keys] and [prefix values; token values]
  (`torch.cat([past_key_value[0], key_layer], dim=2)`), the attention mask extended by P ones in front;
* the embeddings' position ids start after the prefix: `past_key_values_length = P`, so BERT's tokens take positions
  P .. P+L-1 and RoBERTa's `create_position_ids_from_input_ids(input_ids, padding_idx, P)` gives its real tokens
  padding_idx+1+P ..., its padding padding_idx.

transformers 5 takes no `past_key_values` in `BertModel.forward` / `RobertaModel.forward`, so `DeepPrompt.attach`
reproduces both with forward pre-hooks on the unmodified model: on the embeddings (the batch's prefixes are drawn
once per forward and the position ids shifted by P: `cache_length=P`, the same rule transformers 4.x applied, or +P on
explicit position ids) and on each layer's self-attention (its `cache` argument, whose `update(key, value, ...)` the
module calls, returns the prefix keys/values concatenated in front; its 4D attention mask gains P visible columns).
"""

from __future__ import annotations

import inspect
import json
import threading
from dataclasses import asdict, dataclass
from pathlib import Path
from types import SimpleNamespace

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from promptemb.common.errors import ConfigError, UserError
from promptemb.encoder.loading import resolve_model_path

#: Where an export keeps the prefixes (safetensors) and their configuration (JSON).
DEEP_PROMPT_FILE = "promptemb_deep_prompt.safetensors"
DEEP_PROMPT_CONFIG = "promptemb_deep_prompt.json"

#: Model families the prefixes are implemented and tested for: the official code's (BertForCL, RobertaForCL).
FAMILIES = ("bert", "roberta")

#: Attention implementations whose 4D masks the hook extends (boolean for SDPA, additive for eager).
SUPPORTED_ATTENTION = ("eager", "sdpa")


@dataclass(frozen=True)
class DeepPromptConfig:
    """The prefix module's shape. `projection`: the official `prefix_projection` (the prefixes are
    MLP(embedding): Linear(H, projection_hidden_size) -> tanh -> Linear(.., 2·layers·H)); otherwise one embedding
    row of 2·layers·H values per prefix position. `dropout`: applied to the prefixes of each row in training (the
    official `self.dropout`, the model's hidden_dropout_prob)."""

    length: int
    num_layers: int
    num_heads: int
    hidden_size: int
    projection: bool = False
    projection_hidden_size: int = 512
    dropout: float = 0.1
    init_std: float = 0.02

    def __post_init__(self) -> None:
        for key in ("length", "num_layers", "num_heads", "hidden_size", "projection_hidden_size"):
            if int(getattr(self, key)) < 1:
                raise ConfigError(f"deep prompt {key} must be >= 1, got {getattr(self, key)}")
        if self.hidden_size % self.num_heads:
            raise ConfigError(f"hidden size {self.hidden_size} is not a multiple of {self.num_heads} heads")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"deep prompt dropout must be in [0, 1), got {self.dropout}")

    @classmethod
    def for_model(cls, config, length: int, projection: bool = False,
                  projection_hidden_size: int = 512) -> DeepPromptConfig:
        """The shape a transformer's config asks for, with the official dropout (hidden_dropout_prob) and
        initialisation (`init_weights`: normal with the config's initializer_range)."""
        return cls(length=length, num_layers=int(config.num_hidden_layers), num_heads=int(config.num_attention_heads),
                   hidden_size=int(config.hidden_size), projection=projection,
                   projection_hidden_size=projection_hidden_size,
                   dropout=float(getattr(config, "hidden_dropout_prob", 0.1)),
                   init_std=float(getattr(config, "initializer_range", 0.02)))


class PrefixCache:
    """What a self-attention module's `cache` argument must offer: `update(key, value, layer_idx, ...)` returns the
    keys/values it attends over. Here: the layer's prefix keys/values [B, heads, P, d] in front of the tokens' own
    (the official `torch.cat([past_key_value[0], key_layer], dim=2)`); nothing is stored."""

    def __init__(self, key: torch.Tensor, value: torch.Tensor):
        self.key, self.value = key, value

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx=None, *args, **kwargs):
        # autocast runs the projections in bf16/fp16; the prefixes are fp32 parameters
        return (torch.cat([self.key.to(key_states.dtype), key_states], dim=2),
                torch.cat([self.value.to(value_states.dtype), value_states], dim=2))


def extend_attention_mask(mask: torch.Tensor | None, length: int) -> torch.Tensor | None:
    """A [B, 1, Lq, Lk] mask with `length` visible key columns in front (the official mask concatenates P ones before
    the tokens' mask). None stays None: no mask means every key, the prefixes included, is visible."""
    if mask is None:
        return None
    if mask.dim() != 4:
        raise ValueError(f"deep prompts extend 4D attention masks, got one of shape {tuple(mask.shape)}")
    shape = (*mask.shape[:-1], length)
    if mask.dtype == torch.bool:
        front = torch.ones(shape, dtype=torch.bool, device=mask.device)
    else:  # additive: 0 = visible
        front = torch.zeros(shape, dtype=mask.dtype, device=mask.device)
    return torch.cat([front, mask], dim=-1)


def self_attention_modules(transformer: nn.Module) -> list[nn.Module]:
    """Each layer's self-attention module of a BERT-style encoder (`encoder.layer[i].attention.self`), in order;
    refused in one line when the model has no such modules or they take no `cache` argument."""
    layers = getattr(getattr(transformer, "encoder", None), "layer", None)
    if layers is None:
        raise ConfigError(f"deep prompts need a BERT/RoBERTa-style encoder (encoder.layer[i].attention.self); "
                          f"{type(transformer).__name__} has none")
    modules = []
    for layer in layers:
        module = getattr(getattr(layer, "attention", None), "self", None)
        if module is None or "cache" not in inspect.signature(module.forward).parameters:
            raise ConfigError(f"deep prompts need self-attention modules that take a `cache` argument "
                              f"(transformers 5's BertSelfAttention/RobertaSelfAttention); "
                              f"{type(transformer).__name__} has {type(module).__name__}")
        modules.append(module)
    return modules


def local_model_config(name_or_path) -> SimpleNamespace | None:
    """The config.json of a local model (directory or `package:MODULE`) as attributes, read without loading it; None
    for anything else (a Hub name: the loaded model is checked instead)."""
    if not isinstance(name_or_path, str):
        return None
    try:
        directory = Path(resolve_model_path(name_or_path)).expanduser()
        values = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    except (UserError, OSError, ValueError):
        return None
    return SimpleNamespace(**values) if isinstance(values, dict) else None


def check_deep_prompt_model(config) -> None:
    """What a model must be for the prefixes to mean what DCPCSE's do; each refusal is one line, before weights load
    where the caller has only the config."""
    family = getattr(config, "model_type", None)
    if family not in FAMILIES:
        raise ConfigError(f"deep prompts (DCPCSE) are implemented for {' and '.join(FAMILIES)} encoders, the official "
                          f"code's families; the model is {family}")
    if getattr(config, "is_decoder", False) or getattr(config, "is_encoder_decoder", False):
        raise ConfigError(f"deep prompts extend an encoder's bidirectional self-attention; {config.model_type} is "
                          "configured as a decoder, whose cached key/values the prefixes cannot extend")
    if getattr(config, "position_embedding_type", "absolute") != "absolute":
        raise ConfigError(f"deep prompts shift absolute position ids; position_embedding_type="
                          f"{config.position_embedding_type} is not supported")
    implementation = getattr(config, "_attn_implementation", None)
    if implementation is not None and implementation not in SUPPORTED_ATTENTION:
        raise ConfigError(f"deep prompts extend the attention masks of {' and '.join(SUPPORTED_ATTENTION)} attention, "
                          f"not {implementation!r}")


class DeepPrompt(nn.Module):
    """The official `PrefixEncoder` (same parameter names, `embedding` and `trans`, so the official checkpoint's
    `prefix_encoder.*` weights load as they are) and its use: `key_values(B)` is the official `get_prompt(B)`, and
    `attach(transformer)` makes every forward of `transformer` attend over the prefixes (module docstring).

    Layout of the 2·layers·H values of a prefix position, as the official `view(B, P, 2·layers, heads, d)
    .permute(2, 0, 3, 1, 4).split(2)` reads them: layer i's key is slot 2i, its value slot 2i+1."""

    def __init__(self, config: DeepPromptConfig):
        super().__init__()
        self.config = config
        width = config.num_layers * 2 * config.hidden_size
        if config.projection:
            self.embedding = nn.Embedding(config.length, config.hidden_size)
            self.trans = nn.Sequential(nn.Linear(config.hidden_size, config.projection_hidden_size), nn.Tanh(),
                                       nn.Linear(config.projection_hidden_size, width))
        else:
            self.embedding = nn.Embedding(config.length, width)
            self.trans = None
        self.dropout = nn.Dropout(config.dropout)
        # The official model's `init_weights` (BertPreTrainedModel._init_weights) draws these as it draws BERT's own:
        # normal(0, initializer_range), biases 0.
        for module in self.modules():
            if isinstance(module, (nn.Embedding, nn.Linear)):
                nn.init.normal_(module.weight, mean=0.0, std=config.init_std)
                if isinstance(module, nn.Linear):
                    nn.init.zeros_(module.bias)
        self._handles: list = []
        # The prefixes drawn for the forward in flight, per thread: the CPU encoder may run batches of different
        # sizes in threads on the same model (`backbone.parallel_batches`); released when the model's forward ends.
        self._layers: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}

    @property
    def length(self) -> int:
        return self.config.length

    def key_values(self, batch_size: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer, (key, value) [B, heads, P, d]: the official `get_prompt`. Every row gets the same prefixes
        except for dropout, drawn per row and element in training as the official `self.dropout` does."""
        config = self.config
        prefixes = self.embedding.weight if self.trans is None else self.trans(self.embedding.weight)  # [P, 2·L·H]
        head_size = config.hidden_size // config.num_heads
        shaped = prefixes.view(config.length, config.num_layers * 2, config.num_heads, head_size)
        shaped = shaped.unsqueeze(0).expand(batch_size, *shaped.shape)
        if self.training and config.dropout > 0:
            shaped = self.dropout(shaped)
        per_slot = shaped.permute(2, 0, 3, 1, 4)  # [2·L, B, heads, P, d]
        return [(per_slot[2 * i], per_slot[2 * i + 1]) for i in range(config.num_layers)]

    # -- attaching to a transformer -------------------------------------------------------------------------------

    def attach(self, transformer: nn.Module) -> None:
        """Hook the prefixes into `transformer` (its weights untouched; `detach` removes the hooks). Refused in one
        line for a model whose shape differs from the prefixes' or that the hooks cannot serve."""
        config = transformer.config
        check_deep_prompt_model(config)
        expected = DeepPromptConfig.for_model(config, self.config.length)
        for key in ("num_layers", "num_heads", "hidden_size"):
            if getattr(expected, key) != getattr(self.config, key):
                raise ConfigError(f"deep prompt has {key}={getattr(self.config, key)}, the model "
                                  f"{getattr(expected, key)}")
        embeddings = getattr(transformer, "embeddings", None)
        if embeddings is None or "cache_length" not in inspect.signature(embeddings.forward).parameters:
            raise ConfigError(f"deep prompts shift the embeddings' positions through their `cache_length` argument; "
                              f"{type(transformer).__name__}'s embeddings take none")
        attention = self_attention_modules(transformer)
        self.detach()
        self._handles.append(embeddings.register_forward_pre_hook(self._embeddings_hook, with_kwargs=True))
        self._handles.append(transformer.register_forward_hook(self._release, always_call=True))
        for index, module in enumerate(attention):
            self._handles.append(module.register_forward_pre_hook(self._attention_hook(index), with_kwargs=True))

    def detach(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._layers.clear()

    def _embeddings_hook(self, module, args, kwargs):
        """Once per forward: draw the batch's prefixes and start the tokens' positions after them."""
        if args:
            raise ValueError("deep prompts expect the embeddings to be called with keyword arguments, as "
                             "BertModel/RobertaModel call them")
        if kwargs.get("cache_length"):
            raise ValueError("deep prompts cannot extend a model call that already has cached key/values")
        source = kwargs.get("input_ids")
        if source is None:
            source = kwargs["inputs_embeds"]
        self._layers[threading.get_ident()] = self.key_values(source.shape[0])
        if kwargs.get("position_ids") is None:
            # the model's own default positions, started after the prefix: what transformers 4.x did with
            # past_key_values_length = P (BERT: P..P+L-1; RoBERTa: cumsum of non-padding + P, padding at padding_idx)
            kwargs["cache_length"] = self.config.length
        else:
            kwargs["position_ids"] = kwargs["position_ids"] + self.config.length
        return args, kwargs

    def _release(self, module, args, output):
        self._layers.pop(threading.get_ident(), None)

    def _attention_hook(self, index: int):
        def hook(module, args, kwargs):
            if kwargs.get("cache") is not None:
                raise ValueError("deep prompts cannot extend a model call that already has cached key/values")
            if len(args) > 1:
                raise ValueError("deep prompts expect the attention mask as a keyword argument")
            layers = self._layers.get(threading.get_ident())
            if layers is None:
                raise RuntimeError("deep prompt: self-attention ran before the embeddings drew the prefixes")
            key, value = layers[index]
            kwargs["cache"] = PrefixCache(key, value)
            kwargs["attention_mask"] = extend_attention_mask(kwargs.get("attention_mask"), self.config.length)
            return args, kwargs
        return hook

    # -- saving and loading ---------------------------------------------------------------------------------------

    def save(self, directory: str | Path) -> None:
        """The prefixes' weights (safetensors) and configuration (JSON) into `directory`."""
        directory = Path(directory)
        save_file({k: v.detach().cpu().contiguous() for k, v in self.state_dict().items()},
                  str(directory / DEEP_PROMPT_FILE))
        (directory / DEEP_PROMPT_CONFIG).write_text(json.dumps(asdict(self.config), indent=2) + "\n")

    @classmethod
    def load(cls, directory: str | Path) -> DeepPrompt:
        """What `save` wrote (refused in one line when a file is missing or the weights do not fit the config)."""
        directory = Path(directory)
        for name in (DEEP_PROMPT_FILE, DEEP_PROMPT_CONFIG):
            if not (directory / name).is_file():
                raise ConfigError(f"{directory} has no {name}: not an export with deep prompts")
        prompt = cls(DeepPromptConfig(**json.loads((directory / DEEP_PROMPT_CONFIG).read_text())))
        state = load_file(str(directory / DEEP_PROMPT_FILE))
        try:
            prompt.load_state_dict(state)
        except RuntimeError as error:
            raise ConfigError(f"{directory / DEEP_PROMPT_FILE} does not fit its config: "
                              f"{str(error).splitlines()[0]}") from None
        return prompt
