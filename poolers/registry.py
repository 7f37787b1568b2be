"""Pooler names usable in configs (`poolers=[mean,mask]`), each a class plus default arguments; a pooler of the user's
own module registers with `@register_pooler("name")` (docs/extending.md)."""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from typing import Any

from promptemb.common.errors import ConfigError
from promptemb.common.registry import Registry, build_named
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
    PlainLastTokenPooler,
    TokenPrependingPooler,
)
from promptemb.poolers.ditto import DittoPooler
from promptemb.poolers.ensemble import EnsemblePooler
from promptemb.poolers.idf import IdfPooler
from promptemb.poolers.llm2vec import LLM2VecPooler
from promptemb.poolers.mask import MaskPooler
from promptemb.poolers.mask_topk import MaskTopKPooler
from promptemb.poolers.mean import MeanPooler
from promptemb.poolers.moee import MOEE_PROMPTEOL, MoEEPooler
from promptemb.poolers.prompteol_icl import DEFAULT_DEMONSTRATION, DemonstrationPooler
from promptemb.poolers.random_embeddings import RandomEmbeddingPooler
from promptemb.poolers.remove_biases import RemoveBiasesPooler
from promptemb.poolers.sbert_wk import SBERTWKPooler
from promptemb.poolers.static import StaticPooler
from promptemb.poolers.token_average import TokenAveragePooler

BUILTIN_POOLERS: dict[str, tuple[type[Pooler], dict[str, Any]]] = {
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
    "last_token_plain": (PlainLastTokenPooler, {}),
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
    "prompteol_icl": (DemonstrationPooler, {}),
    # MoEE (mixture-of-experts decoders): routing weights, hidden state and their combinations of one forward
    "moee_hs": (MoEEPooler, {"embedding": "hs"}),
    "moee_rw": (MoEEPooler, {"embedding": "rw"}),
    "moee": (MoEEPooler, {"embedding": "concat"}),
    "moee_sum": (MoEEPooler, {"embedding": "sum"}),
    "moee_prompteol": (MoEEPooler, {"embedding": "concat", "template": MOEE_PROMPTEOL}),
    # LLM2Vec: a bidirectional decoder (the causal mask removed), the official input format and its pooling modes
    "llm2vec": (LLM2VecPooler, {}),
    "llm2vec_mean": (LLM2VecPooler, {"pooling_mode": "mean"}),
    "llm2vec_weighted_mean": (LLM2VecPooler, {"pooling_mode": "weighted_mean"}),
    "llm2vec_eos_token": (LLM2VecPooler, {"pooling_mode": "eos_token"}),
    "llm2vec_last_token": (LLM2VecPooler, {"pooling_mode": "last_token"}),
    "llm2vec_bos_token": (LLM2VecPooler, {"pooling_mode": "bos_token"}),
    # ensembles: `ensemble` takes its members from pooler_args (`NAME+NAME` is the same without arguments)
    "ensemble": (EnsemblePooler, {}),
    "ck": (EnsemblePooler, {"members": ["ke", "pcot"], "layer": -1,
                            "paper": "Cheng et al. 2025, CK (zifengcheng/CP --prompt_method ck)"}),
}
POOLERS = Registry("pooler", "docs/reference.md", 'decorate the class with @register_pooler("NAME") in its module and '
                   "pass imports=[MODULE]")
for _name, (_cls, _defaults) in BUILTIN_POOLERS.items():
    POOLERS.register(_name, (_cls, _defaults), owner=_cls)


def register_pooler(name: str, **defaults: Any):
    """Class decorator: `poolers=[name]` builds the class with `defaults` (and the run's `pooler_args.name`). The class
    follows the pooler contract (encoder/pooling.py: `needs`, `__call__`); its constructor takes `name` first."""
    def register(cls: type[Pooler]) -> type[Pooler]:
        if not (isinstance(cls, type) and issubclass(cls, Pooler)):
            raise TypeError(f"@register_pooler({name!r}) decorates a Pooler subclass, not {cls!r}")
        POOLERS.register(name, (cls, dict(defaults)), owner=cls)
        return cls
    return register

#: `NAME@LAYER` (e.g. `prompteol@-2`, `mean@3`) builds pooler NAME at hidden-state index LAYER, so one run can score a
#: method at several layers side by side
LAYER_SEPARATOR = "@"
#: `NAME+NAME` (e.g. `pcot+ke`, `prompteol+echo@-2`) is the plain-mean ensemble of those poolers
ENSEMBLE_SEPARATOR = "+"


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
_MOEE = 'Li & Zhou (2025), "Your Mixture-of-Experts LLM Is Secretly an Embedding Model For Free" (MoEE)'
_LLM2VEC = ('BehnamGhader et al. (2024), "LLM2Vec: Large Language Models Are Secretly Powerful Text Encoders" '
            '(McGill-NLP/llm2vec 0.2.3)')
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
    "last_token_plain": f"{_PROMPTEOL}: the no-prompt baseline, the last token's state of the plain sentence",
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
    "prompteol_icl": f"{_PROMPTEOL}, §3.2 in-context learning: PromptEOL after one demonstration (the official "
                     f"run_icl.sh's, {DEFAULT_DEMONSTRATION} by default)",
    "moee_hs": f"{_MOEE}: HS, the last token's state after the final norm of the prompt `\"[X]\"`",
    "moee_rw": f"{_MOEE}: RW, the routers' logits at the last token over every MoE block, standardised per batch",
    "moee": f"{_MOEE}: MoEE (concat), [HS, RW] standardised per batch",
    "moee_sum": f"{_MOEE}: MoEE (sum), the similarity cos_HS + w·cos_RW as one embedding",
    "moee_prompteol": f"{_MOEE}: MoEE (concat) with the PromptEOL prompt (`--embed_method prompteol`)",
    "ensemble": "a prompt ensemble: the (weighted) mean of its member poolers' embeddings, as MetaEOL (Lei et al. "
                "2024) and CK (Cheng et al. 2025) average prompts",
    "llm2vec": f"{_LLM2VEC}: a bidirectional decoder, the official input format; `pooling_mode` picks the pooling",
    "llm2vec_mean": f"{_LLM2VEC}: mean over the sentence's tokens (the official default)",
    "llm2vec_weighted_mean": f"{_LLM2VEC}: position-weighted mean (weights 1..n over the sentence's tokens)",
    "llm2vec_eos_token": f"{_LLM2VEC}: the state of the end text appended to the sentence",
    "llm2vec_last_token": f"{_LLM2VEC}: the last token's state",
    "llm2vec_bos_token": f"{_LLM2VEC}: the state of the BOS token (`<s>`) in front of the input",
    "ck": 'Cheng et al. (2025), "Contrastive Prompting Enhances Sentence Embeddings in LLMs through Inference-Time '
          'Steering": CK, the mean of the Knowledge Enhancement and Pretended CoT prompts at one layer',
}


def is_ensemble(name: str) -> bool:
    """Whether `name` builds an ensemble: `NAME+NAME`, or a registered ensemble (`ensemble`, `ck`, `ck@-2`)."""
    if ENSEMBLE_SEPARATOR in name:
        return True
    base = split_layer(name)[0]
    return base in POOLERS and POOLERS[base][0] is EnsemblePooler


def ensemble_members(name: str, arguments: Mapping[str, Any] | None = None) -> list[str]:
    """The member names of ensemble `name` with its own pooler_args `arguments` (unchecked; [] when none given)."""
    if ENSEMBLE_SEPARATOR in name:
        return name.split(ENSEMBLE_SEPARATOR)
    members = dict(arguments or {}).get("members", POOLERS[split_layer(name)[0]][1].get("members"))
    return [str(member) for member in members] if isinstance(members, Sequence) and not isinstance(members, str) \
        else []


def _check_name(name: str) -> None:
    for part in name.split(ENSEMBLE_SEPARATOR):
        base = split_layer(part)[0]
        if not part:
            raise ConfigError(f"pooler {name!r} is malformed: join member poolers with {ENSEMBLE_SEPARATOR!r}, e.g. "
                              "pcot+ke")
        if base not in POOLERS:
            raise POOLERS.unknown(base, f"ensemble {name!r}" if part != name else None)


def pooler_class(name: str) -> type[Pooler]:
    """The class behind a registered name (to inspect its arguments without building it)."""
    _check_name(name)
    return EnsemblePooler if ENSEMBLE_SEPARATOR in name else POOLERS[split_layer(name)[0]][0]


def build_pooler(name: str, *, member_args: Mapping[str, Mapping[str, Any]] | None = None,
                 **overrides: Any) -> Pooler:
    """Pooler `name` (`NAME`, `NAME@LAYER` or `NAME+NAME...`) with its `overrides`; an ensemble's members get
    their own `member_args[member]` (the run's pooler_args)."""
    _check_name(name)
    if is_ensemble(name):
        return _build_ensemble(name, overrides, dict(member_args or {}))
    base, layer = split_layer(name)
    if layer is None:
        return build_named(POOLERS, "pooler", name, overrides)
    if "layer" not in inspect.signature(POOLERS[base][0]).parameters:
        raise ConfigError(f"pooler {name!r}: {base!r} has no single layer to set; use pooler_args.{base}")
    return build_named({name: POOLERS[base]}, "pooler", name, {**overrides, "layer": layer})


def _build_ensemble(name: str, overrides: Mapping[str, Any], member_args: dict) -> EnsemblePooler:
    """The members first (each with the run's pooler_args for its name, at the ensemble's shared `layer` if set),
    then the ensemble over them."""
    joined = ENSEMBLE_SEPARATOR in name
    base, at_layer = (name, None) if joined else split_layer(name)
    arguments = {**({} if joined else POOLERS[base][1]), **overrides}
    if at_layer is not None:
        arguments["layer"] = at_layer
    if joined and "members" in arguments:
        raise ConfigError(f"pooler {name!r} names its members; drop pooler_args.{name}.members")
    members = ensemble_members(name, arguments)
    arguments.pop("members", None)
    if not members:
        raise ConfigError(f"pooler {name!r} needs its member poolers: +pooler_args.{name}.members=[pcot,ke], or "
                          f"write them joined by {ENSEMBLE_SEPARATOR!r}: poolers=[pcot+ke]")
    for member in members:
        _check_name(member)
        if is_ensemble(member):
            raise ConfigError(f"pooler {name!r}: member {member!r} is itself an ensemble; list its members instead")
    if len(set(members)) != len(members):
        raise ConfigError(f"pooler {name!r} lists a member twice ({members}); give it a larger weight instead")
    layer = arguments.get("layer")
    built = []
    for member in members:
        extra = dict(member_args.get(member, {}))
        if layer is not None:
            if split_layer(member)[1] is not None or "layer" in extra:
                raise ConfigError(f"pooler {name!r} sets one layer ({layer}) for all its members, and member "
                                  f"{member!r} sets its own; drop one of them")
            if "layer" not in inspect.signature(POOLERS[member][0]).parameters:
                raise ConfigError(f"pooler {name!r}: member {member!r} has no single layer to set to {layer}")
            extra["layer"] = layer
        built.append(build_pooler(member, **extra))
    return build_named({name: (EnsemblePooler, {})}, "pooler", name, {**arguments, "members": built})


def argument_names(names: Sequence[str], pooler_args: Mapping[str, Any] | None = None) -> set[str]:
    """The names `pooler_args` may configure for these poolers: the names and their ensembles' members."""
    pooler_args = dict(pooler_args or {})
    known = set(names)
    for name in names:
        if is_ensemble(name):
            known.update(ensemble_members(name, pooler_args.get(name)))
    return known


def check_pooler_names(names: list[str], pooler_args: Mapping[str, Mapping[str, Any]] | None = None) -> None:
    """Every name registered (or `NAME@LAYER`, `A+B`), none twice, and no `pooler_args` for a pooler not asked for;
    one line each (the settings check calls it before anything loads)."""
    pooler_args = dict(pooler_args or {})
    if not names:
        raise ConfigError(f"no poolers given; {len(POOLERS)} poolers are listed in docs/reference.md")
    for name in names:
        _check_name(name)
    if len(set(names)) != len(names):
        raise ConfigError(f"pooler listed twice in {list(names)}")
    stray = set(pooler_args) - argument_names(names, pooler_args)
    if stray:
        raise ConfigError(f"pooler_args given for {', '.join(sorted(stray))}, which is not in poolers={list(names)}"
                          " (nor a member of an ensemble there)")


def build_poolers(names: list[str], pooler_args: Mapping[str, Mapping[str, Any]] | None = None) -> list[Pooler]:
    check_pooler_names(names, pooler_args)
    pooler_args = dict(pooler_args or {})
    return [build_pooler(name, member_args=pooler_args, **dict(pooler_args.get(name, {}))) for name in names]
