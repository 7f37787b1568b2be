"""Decoder (causal LM) backbones: prompt inputs, padding-independent batches and the one forward of a decoder prompt
method, with Token Prepending and Contrastive Prompting as forward hooks on the unmodified transformers model.

Inputs follow the official code of the decoder prompt methods (kongds/scaling_sentemb and the code built on it):
the filled template is tokenized as ONE string with the tokenizer's own special tokens (a LLaMA tokenizer adds
`<s>`, OPT's adds `</s>`, GPT-2's none), so byte-level merges across the template/sentence boundary (`."`) are the
official ones. Only the sentence is ever truncated: it is cut to its first `max_sentence_tokens` tokens (at that
token's character offset) before it fills the template, so the template's last token, the pooled one, always stays.
Echo inputs are built piece by piece instead, as its official parser does.

Batches are padded on either side; position ids come from the attention mask, so a sentence's embedding does not
depend on the padding side or on the other sentences of its batch (the official code pads on the left and lets
GPT-2-style absolute positions shift with the padding).
"""

from __future__ import annotations

import re
import typing
from typing import TYPE_CHECKING, Literal

import numpy as np
import torch

from promptemb.common.errors import ConfigError
from promptemb.encoder.bidirectional import bidirectional_arguments
from promptemb.encoder.decoder_forms import DecoderForm
from promptemb.encoder.inputs import PAD, POOLED, SENTENCE, SLOT, SPECIAL, TEMPLATE, Batch, InputForm, TokenizedInput
from promptemb.encoder.outputs import EncoderOutput, normalize_layer
from promptemb.encoder.template import Template, apply_sentence_rule

if TYPE_CHECKING:
    from promptemb.encoder.pooling import Needs

#: Token Prepending's placeholder in a template: one position whose state the previous layer's last token overwrites
PLACEHOLDER = "<PST>"
#: Echo templates use the official parser's syntax: `{...}` pieces are tokenized (and truncated) on their own,
#: `{!...}` ones are not pooled, `%%text%%` is the sentence, `<s>` / `</s>` the tokenizer's BOS / EOS.
ECHO_SENTENCE = "%%text%%"
PaddingSide = Literal["right", "left"]
PADDING_SIDES = typing.get_args(PaddingSide)


#: the template every message suggests (PromptEOL's)
EXAMPLE_TEMPLATE = 'This sentence : "[X]" means in one word:"'


def check_last_token_template(who: str, template: Template | None) -> None:
    """Last-token pooling pools the template's own last token: the template must end in text after `[X]`."""
    if template is None:
        raise ConfigError(f"pooler {who!r} pools the last token of a prompt; pass a template, e.g. "
                          f"template.text='{EXAMPLE_TEMPLATE}'")
    suffix = template.suffix.strip()
    if not suffix or suffix.endswith(PLACEHOLDER):
        raise ConfigError(f"pooler {who!r}: template {template.text!r} has no poolable last token (it ends with "
                          f"{PLACEHOLDER if suffix else 'the sentence'}); end it with the prompt's own words, e.g. "
                          f"'{EXAMPLE_TEMPLATE}'")


def is_causal_lm(config) -> bool:
    """A decoder: a model transformers loads as a causal LM and not as a masked LM (BERT and RoBERTa have causal-LM
    heads too)."""
    from transformers import MODEL_FOR_CAUSAL_LM_MAPPING, MODEL_FOR_MASKED_LM_MAPPING

    return type(config) in MODEL_FOR_CAUSAL_LM_MAPPING and type(config) not in MODEL_FOR_MASKED_LM_MAPPING


def special_frame(tokenizer) -> tuple[list[int], list[int]]:
    """The special ids the tokenizer puts before and after a text (e.g. `[<s>]`, `[]` for LLaMA)."""
    plain = tokenizer("a", add_special_tokens=False)["input_ids"]
    full = tokenizer("a", add_special_tokens=True)["input_ids"]
    for start in range(len(full) - len(plain) + 1):
        if full[start : start + len(plain)] == plain:
            return full[:start], full[start + len(plain) :]
    return [], []


def parse_echo_template(template: str) -> list[tuple[str, bool, bool]]:
    """(text, braced, pooled) pieces of an Echo template, in order (the official `EchoParser._parse_template`)."""
    pieces, end = [], 0
    for match in re.finditer(r"\{(.|\n|\r|\t)+?\}", template):
        if match.start() > end:
            pieces.append((template[end : match.start()], False, False))
        body = match.group()[1:-1]
        pooled = not body.startswith("!")
        pieces.append((body if pooled else body[1:], True, pooled))
        end = match.end()
    if end < len(template):
        pieces.append((template[end:], False, False))
    if sum(text.count(ECHO_SENTENCE) for text, _, pooled in pieces if pooled) == 0:
        raise ConfigError(f"echo template {template!r} pools no copy of the sentence; write the pooled copy as "
                          f"{{{ECHO_SENTENCE}}}, e.g. '<s>Document:{{!{ECHO_SENTENCE}}}\\nDocument again:"
                          f"{{{ECHO_SENTENCE}}}{{</s>}}'")
    return pieces


class DecoderInputBuilder:
    """Input sequences of one `InputForm` for a decoder's tokenizer (the encoder-side `InputBuilder`'s interface)."""

    def __init__(self, tokenizer, form: InputForm, max_length: int, padding_side: str = "right"):
        if padding_side not in PADDING_SIDES:
            raise ConfigError(f"unknown padding_side {padding_side!r}; valid: {', '.join(PADDING_SIDES)}")
        self.tokenizer = tokenizer
        self.form = form
        self.max_length = max_length
        self.padding_side = padding_side
        self.decoder = form.decoder or DecoderForm()
        # the official code pads with id 0; any id works, padding is masked out of attention
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self.prefix_specials, self.suffix_specials = special_frame(tokenizer)
        if self.decoder.echo_template is not None:
            self.echo_pieces = parse_echo_template(self.decoder.echo_template)
            fixed = sum(len(self._ids(text)) for text, _, _ in self.echo_pieces if ECHO_SENTENCE not in text)
            copies = sum(text.count(ECHO_SENTENCE) for text, _, _ in self.echo_pieces)
            room = (max_length - fixed) // copies
        elif self.decoder.llm2vec is not None:
            llm2vec = self.decoder.llm2vec
            fixed = len(self._ids(llm2vec.instruction.strip())) + 1 if llm2vec.instruction.strip() else 0
            fixed += len(self._ids(llm2vec.suffix or "")) + 1 if llm2vec.suffix else 0
            room = max_length - len(self.prefix_specials) - len(self.suffix_specials) - fixed
        else:
            template_ids = 0
            if form.template is not None:
                text = form.template.prefix + form.template.suffix
                template_ids = sum(len(self._ids(piece)) + 1 for piece in text.split(PLACEHOLDER)) - 1
            room = max_length - len(self.prefix_specials) - len(self.suffix_specials) - template_ids
        if room < 1:
            raise ConfigError(f"the template of {form.describe()} leaves no room for the sentence in {max_length} "
                              "tokens; shorten the template or raise backbone.max_length")
        self.max_sentence_tokens = min(form.max_sentence_tokens or room, room)

    def _ids(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"] if text else []

    def _cut(self, sentence: str, limit: int) -> tuple[str, bool]:
        """The sentence cut to its first `limit` tokens (at that token's end in the text), and whether it was cut."""
        if self.tokenizer.is_fast:
            encoded = self.tokenizer(sentence, add_special_tokens=False, return_offsets_mapping=True, verbose=False)
            if len(encoded["input_ids"]) <= limit:
                return sentence, False
            return sentence[: encoded["offset_mapping"][limit - 1][1]], True
        ids = self.tokenizer(sentence, add_special_tokens=False, verbose=False)["input_ids"]
        if len(ids) <= limit:
            return sentence, False
        return self.tokenizer.decode(ids[:limit]), True

    def build(self, sentences: list[str]) -> list[TokenizedInput]:
        items = []
        for sentence in sentences:
            if self.decoder.echo_template is not None:
                items.append(self._echo_item(sentence))
                continue
            if self.decoder.llm2vec is not None:
                items.append(self._llm2vec_item(sentence))
                continue
            item = self._prompt_item(sentence, self.form.template.text if self.form.template else None)
            if self.decoder.contrast is not None:
                item.auxiliary = self._prompt_item(sentence, self.decoder.contrast.auxiliary)
            items.append(item)
        return items

    def _prompt_item(self, sentence: str, template: str | None) -> TokenizedInput:
        """The sentence cut first, then the sentence rule (the official code cuts the raw sentence and then adds its
        period), then the template filled."""
        limit, cut = self.max_sentence_tokens, False
        while True:
            text, cut_now = self._cut(sentence, limit)
            if template is not None:
                text = apply_sentence_rule(text, self.form.sentence_rule)
            item = self._fill(text, template)
            cut = cut or cut_now
            # a merge across the template/sentence boundary can add a token: cut one more sentence token then
            if len(item.input_ids) <= self.max_length or limit <= 1:
                item.truncated = cut
                return item
            limit -= len(item.input_ids) - self.max_length

    def _fill(self, sentence: str, template: str | None) -> TokenizedInput:
        """`prefix + sentence + suffix`, stripped as the official code strips it, tokenized as one string (split only
        at `<PST>`, as the tokenizer splits at an added token); tokens overlapping the sentence get the SENTENCE
        role."""
        prefix, suffix = ("", "") if template is None else template.split("[X]")
        filled = prefix + sentence + suffix
        lead = len(filled) - len(filled.lstrip())
        text = filled.strip()
        span = (len(prefix) - lead, len(prefix) - lead + len(sentence))
        ids, roles = list(self.prefix_specials), [SPECIAL] * len(self.prefix_specials)
        offset = 0
        for index, segment in enumerate(text.split(PLACEHOLDER)):
            if index:
                ids.append(self.pad_id)  # any valid id: the embedding at a SLOT is replaced inside the forward
                roles.append(SLOT)
                offset += len(PLACEHOLDER)
            if segment:
                encoded = self.tokenizer(segment, add_special_tokens=False,
                                         return_offsets_mapping=self.tokenizer.is_fast)
                ids += encoded["input_ids"]
                spans = encoded.get("offset_mapping") or [(0, 0)] * len(encoded["input_ids"])
                roles += [SENTENCE if start + offset < span[1] and end + offset > span[0] else TEMPLATE
                          for start, end in spans]
            offset += len(segment)
        ids += self.suffix_specials
        roles += [SPECIAL] * len(self.suffix_specials)
        return TokenizedInput(input_ids=ids, roles=roles, sentence_length=roles.count(SENTENCE))

    def _echo_item(self, sentence: str) -> TokenizedInput:
        """The official `EchoParser`: each piece tokenized on its own without special tokens (`<s>` and `</s>` only
        where the template writes them), each braced piece cut to `max_sentence_tokens`."""
        ids: list[int] = []
        roles: list[int] = []
        truncated = False
        for text, braced, pooled in self.echo_pieces:
            has_sentence = ECHO_SENTENCE in text
            text = text.replace("</s>", self.tokenizer.eos_token or "</s>").replace(
                "<s>", self.tokenizer.bos_token or "<s>").replace(ECHO_SENTENCE, sentence)
            piece = self._ids(text)
            if braced:
                truncated |= len(piece) > self.max_sentence_tokens
                piece = piece[: self.max_sentence_tokens]
            role = POOLED if pooled else SENTENCE if has_sentence else TEMPLATE
            ids += piece
            roles += [role] * len(piece)
        sentence_tokens = sum(1 for role in roles if role in (SENTENCE, POOLED))
        return TokenizedInput(input_ids=ids, roles=roles, sentence_length=sentence_tokens, truncated=truncated)

    def _llm2vec_item(self, sentence: str) -> TokenizedInput:
        """LLM2Vec's input (`LLM2Vec._convert_to_str`, `prepare_for_tokenization`, `tokenize`): the sentence cut to
        `max_sentence_tokens` tokens, `instruction.strip() + " " + sentence` tokenized whole with special tokens
        (the `eos_token` mode first right-strips it and appends its end text); the last n tokens are POOLED, n the
        token count of the sentence part tokenized alone (the official `embed_mask`), every real token when the
        instruction is not skipped."""
        llm2vec = self.decoder.llm2vec
        limit, cut = self.max_sentence_tokens, False
        while True:
            text, cut_now = self._cut(sentence, limit)
            cut = cut or cut_now
            if llm2vec.suffix is not None:
                text = text.rstrip() + llm2vec.suffix
            instruction = llm2vec.instruction.strip()
            ids = self.tokenizer(f"{instruction} {text}" if instruction else text)["input_ids"]
            if len(ids) <= self.max_length or limit <= 1:
                break
            limit -= len(ids) - self.max_length
        pooled = min(len(self._ids(text)), len(ids)) if llm2vec.skip_instruction else len(ids)
        roles = [TEMPLATE] * (len(ids) - pooled) + [POOLED] * pooled
        return TokenizedInput(input_ids=ids, roles=roles, sentence_length=pooled, truncated=cut)

    def collate(self, items: list[TokenizedInput]) -> Batch:
        """Pad on `padding_side`; position ids count real tokens only (0 at the first real token of every row)."""
        width = max(len(item.input_ids) for item in items)
        ids = np.full((len(items), width), self.pad_id, dtype=np.int64)
        roles = np.full((len(items), width), PAD, dtype=np.int64)
        for row, item in enumerate(items):
            start = width - len(item.input_ids) if self.padding_side == "left" else 0
            ids[row, start : start + len(item.input_ids)] = item.input_ids
            roles[row, start : start + len(item.roles)] = item.roles
        roles_t = torch.from_numpy(roles)
        attention_mask = (roles_t != PAD).long()
        batch = Batch(input_ids=torch.from_numpy(ids), attention_mask=attention_mask, roles=roles_t,
                      mask_token=torch.zeros_like(roles_t, dtype=torch.bool),
                      sentence_lengths=torch.tensor([item.sentence_length for item in items], dtype=torch.long),
                      position_ids=(attention_mask.cumsum(1) - 1).clamp(min=0))
        if items[0].auxiliary is not None:
            batch.auxiliary = self.collate([item.auxiliary for item in items])
        return batch


def last_positions(attention_mask: torch.Tensor) -> torch.Tensor:
    """[B] index of each row's last real token, whichever side the padding is on."""
    positions = torch.arange(attention_mask.shape[1], device=attention_mask.device)
    return (positions * attention_mask).argmax(1)


def decoder_layers(transformer: torch.nn.Module) -> torch.nn.ModuleList:
    """The list of the model's transformer blocks (`layers`, `h`, `decoder.layers`, ...): its ModuleList of
    `num_hidden_layers` entries."""
    depth = int(transformer.config.num_hidden_layers)
    for module in transformer.modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) == depth:
            return module
    raise ConfigError(f"cannot find the {depth} transformer blocks of {type(transformer).__name__}; Token "
                      "Prepending and Contrastive Prompting need a model whose blocks form one ModuleList")


#: where transformers families keep the attention output projection (its input = the concatenated heads)
OUTPUT_PROJECTIONS = ("self_attn.o_proj", "self_attn.out_proj", "attn.c_proj", "self_attention.dense",
                      "attention.dense", "attn.out_proj")


def attention_output_projection(block: torch.nn.Module) -> torch.nn.Module:
    for path in OUTPUT_PROJECTIONS:
        module = block
        for attribute in path.split("."):
            module = getattr(module, attribute, None)
            if module is None:
                break
        if isinstance(module, torch.nn.Module):
            return module
    raise ConfigError(f"cannot find the attention output projection of {type(block).__name__} (tried "
                      f"{', '.join(OUTPUT_PROJECTIONS)}); Contrastive Prompting cannot run on this model")


def placeholder_embedding(seed: int, size: int) -> torch.Tensor:
    """Token Prepending's `<PST>` input embedding: N(0, 1) drawn from a CPU generator seeded with `seed` (the
    official code draws an unseeded `torch.randn` on the model's device)."""
    return torch.randn(size, generator=torch.Generator().manual_seed(seed))


class _ForwardDoneError(Exception):
    """Raised by a hook once the activation it waits for is captured: the rest of the forward is not needed."""


def auxiliary_activation(transformer: torch.nn.Module, batch: Batch, layer: int) -> torch.Tensor:
    """[B, D'] input of block `layer`'s attention output projection at each row's last token for the auxiliary
    prompt; the forward stops there (the official code exits after that block too)."""
    projection = attention_output_projection(decoder_layers(transformer)[layer])
    rows = torch.arange(batch.input_ids.shape[0], device=batch.input_ids.device)
    last = last_positions(batch.attention_mask)
    captured: list[torch.Tensor] = []

    def capture(_module, args):
        captured.append(args[0][rows, last])
        raise _ForwardDoneError

    handle = projection.register_forward_pre_hook(capture)
    try:
        transformer(input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids,
                    use_cache=False)
    except _ForwardDoneError:
        pass
    finally:
        handle.remove()
    return captured[0]


def run_decoder(transformer: torch.nn.Module, batch: Batch, needs: Needs, form: InputForm) -> EncoderOutput:
    """One forward of a decoder on `batch` (plus the auxiliary prompt's partial forward for Contrastive Prompting),
    keeping the hidden states of the layers `needs` asks for. `hidden_states[L]` is after the final norm, every
    other index a raw block output."""
    num_layers = int(transformer.config.num_hidden_layers)
    out = EncoderOutput(num_layers=num_layers, input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                        roles=batch.roles, mask_token=batch.mask_token)
    word_embeddings = transformer.get_input_embeddings()
    if needs.word_embeddings:
        out.word_embeddings = word_embeddings(batch.input_ids)
    layers = {normalize_layer(layer, num_layers) for layer in needs.layers}
    if not layers and not needs.router_logits:
        return out
    decoder = form.decoder or DecoderForm()
    rows = torch.arange(batch.input_ids.shape[0], device=batch.input_ids.device)
    last = last_positions(batch.attention_mask)
    inputs = {"attention_mask": batch.attention_mask, "position_ids": batch.position_ids, "use_cache": False}
    if decoder.bidirectional:  # LLM2Vec: the causal mask removed for this call (encoder/bidirectional.py)
        inputs.update(bidirectional_arguments(transformer, batch.attention_mask))
    handles = []
    if decoder.prepending is not None:
        slot = (batch.roles == SLOT).long().argmax(1)
        embeds = word_embeddings(batch.input_ids)
        if decoder.prepending.vector is not None:  # resolved from the model, a file or the seed (placeholder.py)
            vector = torch.tensor(decoder.prepending.vector.values, dtype=torch.float64)
        else:
            vector = placeholder_embedding(decoder.prepending.seed, embeds.shape[-1])
        embeds = embeds.clone()
        embeds[rows, slot] = vector.to(embeds.device, embeds.dtype)
        inputs["inputs_embeds"] = embeds

        def prepend(_module, args):
            states = args[0].clone()
            states[rows, slot] = args[0][rows, last]
            return (states, *args[1:])

        blocks = decoder_layers(transformer)
        handles = [blocks[i].register_forward_pre_hook(prepend)
                   for i in range(decoder.prepending.start, min(decoder.prepending.exit, num_layers))]
    else:
        inputs["input_ids"] = batch.input_ids
    if decoder.contrast is not None:
        contrast = decoder.contrast
        auxiliary = auxiliary_activation(transformer, batch.auxiliary, contrast.layer)

        def subtract(_module, args):
            values = args[0].clone()
            values[rows, last] = contrast.coeff * (args[0][rows, last] - auxiliary)
            return (values, *args[1:])

        block = decoder_layers(transformer)[contrast.layer]
        handles.append(attention_output_projection(block).register_forward_pre_hook(subtract))
    if needs.router_logits:  # MoE models record each router's logits, flattened to [B*T, E] (MoEE)
        inputs["output_router_logits"] = True
    try:
        model_out = transformer(**inputs, output_hidden_states=True)
    finally:
        for handle in handles:
            handle.remove()
    out.hidden_states = {layer: model_out.hidden_states[layer] for layer in layers}
    if needs.router_logits:
        shape = batch.input_ids.shape
        out.router_logits = tuple(logits.reshape(*shape, -1) for logits in model_out.router_logits)
    return out
