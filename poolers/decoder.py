"""Decoder prompt methods: the state of a template's last token (or of a span) of a causal LM, at any layer.

Layer indices follow the framework: 0 = embedding output, 1..L = the blocks, negatives count back; `hidden_states[L]`
(layer -1) is after the model's final norm, every other index a raw block output (layer -2 = block L-1's output).
Each method's defaults are its paper's / official code's (recorded in provenance through `arguments`).
"""

from __future__ import annotations

from dataclasses import replace

import torch

from promptemb.common.errors import ConfigError
from promptemb.encoder.decoder import EXAMPLE_TEMPLATE, PLACEHOLDER, last_positions
from promptemb.encoder.decoder_forms import ContrastivePrompting, DecoderForm, TokenPrepending
from promptemb.encoder.inputs import POOLED, InputForm
from promptemb.encoder.outputs import EncoderOutput
from promptemb.encoder.placeholder import check_placeholder, resolve_placeholder
from promptemb.encoder.template import Template
from promptemb.poolers.base import Needs, Pooler, masked_mean

#: Jiang et al. 2023, "Scaling Sentence Embeddings with Large Language Models" (kongds/scaling_sentemb)
PROMPTEOL = EXAMPLE_TEMPLATE
#: Zhang et al. 2024, "Simple Techniques for Enhancing Sentence Embeddings in Generative Language Models"
#: (ZBWpro/PretCoTandKE settings.py)
PRETENDED_COT = 'After thinking step by step , this sentence : "[X]" means in one word:"'
KNOWLEDGE_ENHANCEMENT = ('The essence of a sentence is often captured by its main subjects and actions, while '
                         'descriptive terms provide additional but less central details. With this in mind , this '
                         'sentence : "[X]" means in one word:"')
#: Lei et al. 2024, "Meta-Task Prompting Elicits Embeddings from Large Language Models" (Yibin-Lei/MetaEOL
#: evaluation.py): 8 meta-task prompts
METAEOL = (
    "In this task, you're presented with a text excerpt. Your task is to categorize the excerpt into a broad category "
    "such as 'Education', 'Technology', 'Health', 'Business', 'Environment', 'Politics', or 'Culture'. These "
    "categories help in organizing content for better accessibility and targeting. For this task, this sentence : "
    "\"[X]\" should be classified under one general category in one word:\"",
    "In this task, you're given a statement and you need to determine whether it's presenting an 'Opinion' or a "
    "'Fact'. This distinction is vital for information verification, educational purposes, and content analysis. "
    "For this task, this sentence : \"[X]\" discriminates between opinion and fact in one word:\"",
    "In this task, you're given a review from an online platform. Your task is to generate a rating for the product "
    "based on the review on a scale of 1-5, where 1 means 'extremely negative' and 5 means 'extremely positive'. For "
    "this task, this sentence : \"[X]\" reflects the sentiment in one word:\"",
    "In this task, you're reading a personal diary entry. Your task is to identify the predominant emotion expressed, "
    "such as joy, sadness, anger, fear, or love. For this task, this sentence : \"[X]\" conveys the emotion in one "
    "word:\"",
    "In this task, you're presented with two sentences. Your task is to assess whether the sentences convey the same "
    "meaning. Use 'identical', 'similar', 'different', or 'unrelated' to describe the relationship. To enhance the "
    "performance of this task, this sentence : \"[X]\" means in one word:\"",
    "In this task, you're given a sentence and a phrase. Your task is to determine if the phrase can be a contextual "
    "synonym within the given sentence. Options include 'yes', 'no', or 'partially'. To enhance the performance of "
    "this task, this sentence : \"[X]\" means in one word:\"",
    "In this task, you're examining a news article. Your task is to extract the most critical fact from the article. "
    "For this task, this sentence : \"[X]\" encapsulates the key fact in one word:\"",
    "In this task, you're reviewing a scientific abstract. Your task is to identify the main entities (e.g., "
    "proteins, diseases) and their relations (e.g., causes, treats). For this task, this sentence : \"[X]\" "
    "highlights the primary entity or relation in one word:\"",
)
#: Springer et al. 2024, "Repetition Improves Language Model Embeddings" (jakespringer/echo-embeddings README): the
#: document template, for symmetric tasks such as STS
ECHO_DOCUMENT = "<s>Document:{!%%text%%}\nDocument again:{%%text%%}{</s>}"
#: Fu et al. 2025, "Token Prepending" (fuyuchenIfyw/token_prepending evaluate.py): PromptEOL with `<PST>` before
#: the quoted sentence
TOKEN_PREPENDING_PROMPTEOL = 'This sentence : <PST> "[X]" means in one word:"'
#: Cheng et al. 2025, "Contrastive Prompting" (zifengcheng/CP evaluate_intervention.py): the auxiliary prompt
CONTRASTIVE_AUXILIARY = 'The irrelevant information of this sentence : "[X]" means in one word:"'


class LastTokenPooler(Pooler):
    """e = h^(l)_T: the hidden state at layer `layer` of the last real token T of the templated input.

    PromptEOL (Jiang et al. 2023): template `This sentence : "[X]" means in one word:"`, layer -1 (after the final
    norm). Pretended CoT and Knowledge Enhancement (Zhang et al. 2024): their templates, layer -2 (a raw block
    output). `template` None pools the run's template (the decoder analogue of `mask`, which keeps meaning the
    [MASK] position of an encoder). The official code tokenizes the filled template as one string, pads on the left
    with id 0 and takes `hidden_states[layer][:, -1]`; the last real token is the same position on either side.
    """

    def __init__(self, name: str = "last_token", layer: int = -1, template: str | None = None,
                 sentence_rule: str = "prompteol", paper: str | None = None, decoder: DecoderForm | None = None):
        super().__init__(name)
        self.layer = layer
        self.template = None if template is None else Template(template)
        self.sentence_rule = sentence_rule
        self.paper = paper
        self.decoder = decoder

    @property
    def needs(self) -> Needs:
        return Needs(layers=(self.layer,), templated=True, decoder=True)

    def input_form(self) -> InputForm | None:
        if self.template is None:
            return None
        return InputForm(self.template, self.sentence_rule, None, self.decoder)

    def __call__(self, out: EncoderOutput) -> torch.Tensor:
        states = out.layer(self.layer)
        rows = torch.arange(states.shape[0], device=states.device)
        return states[rows, last_positions(out.attention_mask)]

    def arguments(self) -> dict:
        record = {"layer": self.layer, "paper": self.paper}
        if self.template is not None:
            record.update(template=self.template.text, sentence_rule=self.sentence_rule)
        if self.decoder is not None:
            record.update(self.decoder.describe())
        return record


class PlainLastTokenPooler(LastTokenPooler):
    """e = h^(l)_T of the plain sentence, no prompt: the last real token's state, the no-prompt baseline beside
    `mean` (Jiang et al. 2023 compare PromptEOL with both). It shares the plain sentence's forward with `mean`: the
    sentence framed by the tokenizer's own special tokens (LLaMA `<s>` before it, OPT `</s>` before it, GPT-2 and
    SmolLM2 none), so T is the sentence's last token, or the end token where a tokenizer appends one. The run's
    template and sentence rule do not apply; a truncated sentence pools its last kept token."""

    def __init__(self, name: str = "last_token_plain", layer: int = -1, paper: str | None = None):
        super().__init__(name, layer, None, "none", paper)

    @property
    def needs(self) -> Needs:
        return Needs(layers=(self.layer,), decoder=True)

    def arguments(self) -> dict:
        return {"layer": self.layer, "paper": self.paper, "input": "plain sentence (no template)"}


class TokenPrependingPooler(LastTokenPooler):
    """Token Prepending (Fu et al. 2025): e = h^(l)_T of a template with a `<PST>` slot before the sentence; before
    each block i with `start` <= i < `exit` (0-based) the `<PST>` input is overwritten with that block's input at the
    last token, so earlier tokens see a summary of the whole sentence; block 0 sees the `<PST>` embedding.
    `placeholder` picks that embedding: `auto` (default) the model's own `<PST>` row when its tokenizer has the token,
    else N(0, 1) drawn with `seed`; `tokenizer` that row or a refusal; `random` the draw; a `.npy` path that vector.
    Defaults: the official config for LLaMA-2-7B (`output_layer` 27 = a raw intermediate layer, start 1, exit 7);
    smaller models need smaller values (pooler_args)."""

    def __init__(self, name: str = "token_prepending", layer: int = 27, template: str = TOKEN_PREPENDING_PROMPTEOL,
                 sentence_rule: str = "prompteol", start: int = 1, exit: int = 7, seed: int = 3407,
                 placeholder: str = "auto", paper: str = "Fu et al. 2025, Token Prepending"):
        if PLACEHOLDER not in template:
            raise ConfigError(f"pooler {name!r}: template {template!r} has no {PLACEHOLDER} slot; write one before "
                              f"the sentence, e.g. '{TOKEN_PREPENDING_PROMPTEOL}'")
        if not 0 <= start < exit:
            raise ConfigError(f"pooler {name!r}: Token Prepending needs 0 <= start < exit, got start={start}, "
                              f"exit={exit}")
        self.placeholder = placeholder
        self.placeholder_file = check_placeholder(name, placeholder)
        super().__init__(name, layer, template, sentence_rule, paper,
                         DecoderForm(prepending=TokenPrepending(start, exit, seed)))

    def check_model(self, config) -> None:
        depth = int(config.num_hidden_layers)
        if self.decoder.prepending.start >= depth:
            raise ConfigError(f"pooler {self.name!r}: start block {self.decoder.prepending.start} is out of range "
                              f"for a model with {depth} blocks (0..{depth - 1})")

    def bind_encoder(self, encoder) -> None:
        """The `<PST>` vector of this model (its row, the file's vector checked against its size, or the draw)."""
        prepending = self.decoder.prepending
        vector = resolve_placeholder(self.name, self.placeholder, self.placeholder_file, prepending.seed,
                                     encoder.tokenizer, encoder.transformer)
        self.decoder = DecoderForm(prepending=replace(prepending, vector=vector))

    def arguments(self) -> dict:
        return {**super().arguments(), "placeholder": self.placeholder}


class ContrastivePromptingPooler(LastTokenPooler):
    """Contrastive Prompting (Cheng et al. 2025): e = h^(l)_T of the main template where, in block `act_layer`
    (0-based), the attention output projection's input at the last token, A, is replaced by coeff·(A − B), B being
    that value for the auxiliary prompt `The irrelevant information of this sentence : "[X]" means in one word:"`
    (run as its own batch up to that block). Defaults: the official script for LLaMA-2-7B (`output_layer` 27,
    `act_layer` 4, coeff 0.5, the `scaled` plan on `att_head`)."""

    def __init__(self, name: str = "contrastive_prompting", layer: int = 27, template: str = PROMPTEOL,
                 sentence_rule: str = "prompteol", auxiliary: str = CONTRASTIVE_AUXILIARY, act_layer: int = 4,
                 coeff: float = 0.5, paper: str = "Cheng et al. 2025, Contrastive Prompting"):
        Template(auxiliary)  # exactly one [X]
        super().__init__(name, layer, template, sentence_rule, paper,
                         DecoderForm(contrast=ContrastivePrompting(auxiliary, act_layer, float(coeff))))

    def check_model(self, config) -> None:
        depth = int(config.num_hidden_layers)
        if not 0 <= self.decoder.contrast.layer < depth:
            raise ConfigError(f"pooler {self.name!r}: act_layer {self.decoder.contrast.layer} is out of range for a "
                              f"model with {depth} blocks (0..{depth - 1})")


class EchoPooler(Pooler):
    """Echo embeddings (Springer et al. 2024): the sentence written twice, `<s>Document:{!x}\\nDocument again:{x}
    {</s>}`; e = h^(l) at the last pooled token (`strategy` last: the closing `</s>`) or the mean over the pooled
    span (`mean`: the second copy and `</s>`), so every pooled token has seen the whole sentence. As the official
    `EchoParser`: pieces tokenized separately, `<s>` only where written, each braced piece truncated on its own, right
    padding, `last_hidden_state` (layer -1)."""

    STRATEGIES = ("last", "mean")

    def __init__(self, name: str = "echo", layer: int = -1, template: str = ECHO_DOCUMENT, strategy: str = "last",
                 paper: str = "Springer et al. 2024, Repetition Improves Language Model Embeddings"):
        super().__init__(name)
        if strategy not in self.STRATEGIES:
            raise ConfigError(f"pooler {name!r}: unknown strategy {strategy!r}; valid: {', '.join(self.STRATEGIES)}")
        self.layer = layer
        self.strategy = strategy
        self.paper = paper
        self.decoder = DecoderForm(echo_template=template)

    @property
    def needs(self) -> Needs:
        return Needs(layers=(self.layer,), templated=True, decoder=True)

    def input_form(self) -> InputForm:
        return InputForm(None, "none", None, self.decoder)

    def __call__(self, out: EncoderOutput) -> torch.Tensor:
        states = out.layer(self.layer)
        pooled = (out.roles == POOLED).long()
        if self.strategy == "mean":
            return masked_mean(states, pooled)
        rows = torch.arange(states.shape[0], device=states.device)
        return states[rows, last_positions(pooled)]

    def arguments(self) -> dict:
        return {"layer": self.layer, "strategy": self.strategy, "paper": self.paper, **self.decoder.describe()}


class MultiPromptPooler(Pooler):
    """MetaEOL (Lei et al. 2024): e = (1/K) Σ_k h^(l)_T(prompt_k), the plain mean of the last-token states of K
    meta-task prompts (the official code's `outputs.view(-1, K, D).mean(1)`; no normalisation). Each prompt is its
    own input form, so it costs K forwards."""

    def __init__(self, name: str = "metaeol", layer: int = -1, templates: tuple[str, ...] | list[str] = METAEOL,
                 sentence_rule: str = "prompteol", paper: str = "Lei et al. 2024, MetaEOL"):
        super().__init__(name)
        if not templates:
            raise ConfigError(f"pooler {name!r} needs at least one template")
        self.layer = layer
        self.paper = paper
        self._parts = [LastTokenPooler(f"{name}#prompt{index}", layer, text, sentence_rule, paper)
                       for index, text in enumerate(templates)]

    @property
    def needs(self) -> Needs:
        return Needs(layers=(self.layer,), templated=True, decoder=True)

    def parts(self) -> list[Pooler]:
        # named after this pooler's current name: renamed copies (metaeol@2, a layer sweep's metaeol[3]) must not
        # share part names, or their embeddings would overwrite each other
        for index, part in enumerate(self._parts):
            part.name = f"{self.name}#prompt{index}"
        return list(self._parts)

    def __call__(self, out: EncoderOutput) -> torch.Tensor:
        raise TypeError(f"pooler {self.name!r} averages {len(self._parts)} input forms; embed it through "
                        "Encoder.embed, which runs each of its prompts")

    def arguments(self) -> dict:
        return {"layer": self.layer, "paper": self.paper, "templates": [p.template.text for p in self._parts],
                "sentence_rule": self._parts[0].sentence_rule, "combine": "mean"}
