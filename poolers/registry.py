"""Pooler names usable in configs (`poolers=[mean,mask]`), each a class plus default arguments."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from promptemb.common.errors import ConfigError
from promptemb.common.registry import build_named
from promptemb.poolers.base import Pooler
from promptemb.poolers.cls import CLSPooler
from promptemb.poolers.decoder import (
    KNOWLEDGE_ENHANCEMENT,
    PRETENDED_COT,
    PROMPTEOL,
    ContrastivePromptingPooler,
    EchoPooler,
    LastTokenPooler,
    MultiPromptPooler,
    TokenPrependingPooler,
)
from promptemb.poolers.ditto import DittoPooler
from promptemb.poolers.idf import IdfPooler
from promptemb.poolers.mask import MaskPooler
from promptemb.poolers.mask_topk import MaskTopKPooler
from promptemb.poolers.mean import MeanPooler
from promptemb.poolers.random_embeddings import RandomEmbeddingPooler
from promptemb.poolers.remove_biases import RemoveBiasesPooler
from promptemb.poolers.sbert_wk import SBERTWKPooler
from promptemb.poolers.static import StaticPooler
from promptemb.poolers.token_average import TokenAveragePooler

_REGISTRY: dict[str, tuple[type[Pooler], dict[str, Any]]] = {
    "cls": (CLSPooler, {}),
    "mean": (MeanPooler, {}),
    "first_last": (MeanPooler, {"layers": [1, -1]}),
    "avg": (MeanPooler, {"templated": True}),
    "static": (StaticPooler, {}),
    "mask": (MaskPooler, {}),
    "mask_denoised": (MaskPooler, {"denoise": True}),
    "mask_topk": (MaskTopKPooler, {}),
    "ditto": (DittoPooler, {}),
    "sbert_wk": (SBERTWKPooler, {}),
    "idf": (IdfPooler, {}),
    "remove_biases": (RemoveBiasesPooler, {}),
    "remove_biases_contextual": (RemoveBiasesPooler, {"variant": "contextual"}),
    # Stankevičius & Lukoševičius: token weighting on the templated input, templated average without [MASK], baselines
    "avg_no_mask": (MeanPooler, {"templated": True, "include_mask": False}),
    "avg_idf": (IdfPooler, {"templated": True}),
    "avg_remove_biases": (RemoveBiasesPooler, {"variant": "contextual", "templated": True}),
    "random": (RandomEmbeddingPooler, {}),
    "token_avg": (TokenAveragePooler, {}),
    "bert_token_avg": (TokenAveragePooler, {"weight": 0.5}),
    # decoder prompt methods (causal LMs); each carries its own template and paper defaults
    "last_token": (LastTokenPooler, {}),
    "prompteol": (LastTokenPooler, {"template": PROMPTEOL, "paper": "Jiang et al. 2023, PromptEOL"}),
    "pcot": (LastTokenPooler, {"template": PRETENDED_COT, "layer": -2,
                               "paper": "Zhang et al. 2024, Pretended Chain of Thought"}),
    "ke": (LastTokenPooler, {"template": KNOWLEDGE_ENHANCEMENT, "layer": -2,
                             "paper": "Zhang et al. 2024, Knowledge Enhancement"}),
    "metaeol": (MultiPromptPooler, {}),
    "echo": (EchoPooler, {}),
    "echo_mean": (EchoPooler, {"strategy": "mean"}),
    "token_prepending": (TokenPrependingPooler, {}),
    "contrastive_prompting": (ContrastivePromptingPooler, {}),
}
POOLER_NAMES = tuple(_REGISTRY)
#: `NAME@LAYER` (e.g. `prompteol@-2`, `mean@3`) builds pooler NAME at hidden-state index LAYER, so one run can score a
#: method at several layers side by side
LAYER_SEPARATOR = "@"


def split_layer(name: str) -> tuple[str, int | None]:
    """(registered name, layer or None) of `NAME` or `NAME@LAYER`."""
    base, separator, layer = name.partition(LAYER_SEPARATOR)
    if not separator:
        return name, None
    try:
        return base, int(layer)
    except ValueError:
        raise ConfigError(f"pooler {name!r}: the part after {LAYER_SEPARATOR!r} must be a layer index, e.g. "
                          f"{base}{LAYER_SEPARATOR}-2") from None

_EXTRACTION_STUDY = ('Stankevičius & Lukoševičius (2024), "Extracting Sentence Embeddings from Pretrained Transformer '
                     'Models"')
_PROMPTBERT = 'Jiang et al. (2022), "PromptBERT: Improving BERT Sentence Embeddings with Prompts"'
#: The paper (and the part of it) each registered name follows; docs/reference.md is generated from this and the
#: classes' docstrings (`python -m promptemb.research.component_reference`).
_PROMPTEOL = 'Jiang et al. (2023), "Scaling Sentence Embeddings with Large Language Models" (PromptEOL)'
_PRETCOT_KE = ('Zhang et al. (2024), "Simple Techniques for Enhancing Sentence Embeddings in Generative Language '
               'Models"')
_ECHO = 'Springer et al. (2024), "Repetition Improves Language Model Embeddings"'
PAPERS: dict[str, str] = {
    "cls": 'Devlin et al. (2019), "BERT": the [CLS] state',
    "mean": 'Reimers & Gurevych (2019), "Sentence-BERT": mean pooling',
    "first_last": 'Li et al. (2020), "On the Sentence Embeddings from Pre-trained Language Models" (first-last avg.); '
                  'layers 1 and L as SimCSE (Gao et al., 2021) reports it',
    "avg": f"{_PROMPTBERT}, Table 1: the average over the templated input",
    "static": f"{_PROMPTBERT}, §3: the static token embeddings, averaged",
    "mask": f"{_PROMPTBERT}, Eq. 2: the [MASK] state",
    "mask_denoised": f"{_PROMPTBERT}, §5: the [MASK] state minus the template bias (template denoising)",
    "mask_topk": f"{_PROMPTBERT}, Eq. 3: the top-k MLM tokens' static embeddings weighted by their probabilities",
    "ditto": 'Chen et al. (2023), "Ditto: A Simple and Efficient Approach to Improve Sentence Embeddings", Eq. 2-3',
    "sbert_wk": 'Wang & Kuo (2020), "SBERT-WK: A Sentence Embedding Method by Dissecting BERT-based Word Models", '
                "§IV, Eq. 9-15",
    "idf": f"{_EXTRACTION_STUDY}: idf-weighted average",
    "remove_biases": f"{_PROMPTBERT}, §3 / Table 2: static embeddings without the biased tokens",
    "remove_biases_contextual": f"{_PROMPTBERT}, §3 / Table 2: last-layer states without the biased tokens",
    "avg_no_mask": f"{_EXTRACTION_STUDY}: templated average without the [MASK] tokens",
    "avg_idf": f"{_EXTRACTION_STUDY}: idf-weighted templated average",
    "avg_remove_biases": f"{_EXTRACTION_STUDY} with {_PROMPTBERT}'s token filter: templated average without the "
                         "biased tokens",
    "random": f"{_EXTRACTION_STUDY}: the Random Embeddings baseline",
    "token_avg": f"{_EXTRACTION_STUDY}: the Avg. static model",
    "bert_token_avg": f"{_EXTRACTION_STUDY}: BERT+Avg.",
    "last_token": f"{_PROMPTEOL}: the last token's state of the run's template",
    "prompteol": f"{_PROMPTEOL}: the last token's state of `This sentence : \"[X]\" means in one word:\"`",
    "pcot": f"{_PRETCOT_KE}: Pretended Chain of Thought, the last token at layer -2",
    "ke": f"{_PRETCOT_KE}: Knowledge Enhancement, the last token at layer -2",
    "metaeol": 'Lei et al. (2024), "Meta-Task Prompting Elicits Embeddings from Large Language Models": the mean '
               "over 8 meta-task prompts",
    "echo": f"{_ECHO}: the last pooled token (`</s>`) after the repeated sentence",
    "echo_mean": f"{_ECHO}: the mean over the second copy of the sentence",
    "token_prepending": 'Fu et al. (2025), "Token Prepending: A Training-Free Approach for Eliciting Better Sentence '
                        'Embeddings from LLMs"',
    "contrastive_prompting": 'Cheng et al. (2025), "Contrastive Prompting Enhances Sentence Embeddings in LLMs through '
                             'Inference-Time Steering"',
}


def pooler_class(name: str) -> type[Pooler]:
    """The class behind a registered name (to inspect its arguments without building it)."""
    name = split_layer(name)[0]
    if name not in _REGISTRY:
        raise ConfigError(f"unknown pooler {name!r}; valid poolers: {', '.join(POOLER_NAMES)}")
    return _REGISTRY[name][0]


def build_pooler(name: str, **overrides: Any) -> Pooler:
    base, layer = split_layer(name)
    if layer is None:
        return build_named(_REGISTRY, "pooler", "valid poolers", name, overrides)
    if base not in _REGISTRY:
        raise ConfigError(f"unknown pooler {base!r}; valid poolers: {', '.join(POOLER_NAMES)}")
    if "layer" not in inspect.signature(_REGISTRY[base][0]).parameters:
        raise ConfigError(f"pooler {name!r}: {base!r} has no single layer to set; use pooler_args.{base}")
    return build_named({name: _REGISTRY[base]}, "pooler", "valid poolers", name, {**overrides, "layer": layer})


def build_poolers(names: list[str], pooler_args: Mapping[str, Mapping[str, Any]] | None = None) -> list[Pooler]:
    pooler_args = dict(pooler_args or {})
    unknown = [name for name in names if split_layer(name)[0] not in _REGISTRY]
    if unknown:
        raise ConfigError(f"unknown pooler {', '.join(unknown)}; valid poolers: {', '.join(POOLER_NAMES)}")
    if not names:
        raise ConfigError(f"no poolers given; valid poolers: {', '.join(POOLER_NAMES)}")
    if len(set(names)) != len(names):
        raise ConfigError(f"pooler listed twice in {list(names)}")
    stray = set(pooler_args) - set(names)
    if stray:
        raise ConfigError(f"pooler_args given for {', '.join(sorted(stray))}, which is not in poolers={list(names)}")
    return [build_pooler(name, **dict(pooler_args.get(name, {}))) for name in names]
