"""README.md of an export: what the model is, how to load it, and its STS scores when known."""

from __future__ import annotations

from promptemb.evaluation.report import markdown_table


def describe_pooler(record: dict) -> str:
    pooler = record["pooler"]
    if pooler["name"] == "llm2vec":
        spec = record["llm2vec"]
        return (f"`llm2vec`: LLM2Vec's `{spec['pooling_mode']}` pooling of the last layer (after the final norm) over "
                "the sentence's own tokens, the decoder run with bidirectional attention (the causal mask removed)")
    if pooler["name"] == "last_token":
        return (f"`last_token`: layer {pooler['layer']} state (hidden_states[-1] is after the final norm) at the "
                "last token of the filled template (PromptEOL-style)")
    if pooler["name"] == "avg":
        return f"`avg`: mean of layer {pooler['layer']} over all tokens of the templated input (template included)"
    if pooler["name"] == "cls":
        text = f"`cls`: layer {pooler['layer']} state at [CLS], the model attending over its deep prompts (DCPCSE)"
        return text + (", through the trained head tanh(W x + b)" if pooler["head"] else "")
    text = f"`mask`: layer {pooler['layer']} state at the template's [MASK]"
    if pooler.get("which_mask") is not None:
        text += f" number {pooler['which_mask']} (0 the first, -1 the last)"
    if pooler["head"] and pooler["head"].get("after_denoise"):
        return text + (", minus the template bias (template denoising: the [MASK] state of the template alone with "
                       "positions shifted by the sentence length), through the trained head tanh(W x + b)")
    if pooler["head"]:
        text += ", through the trained MLM-transform head (dense + activation + LayerNorm)"
    if pooler["denoise"]:
        text += ", minus the template bias (template denoising: the [MASK] state of the template alone with positions "
        text += "shifted by the sentence length)"
    return text


def sentence_transformers_use(record: dict) -> tuple[str, list[str], str]:
    """(the card's line on the export's sentence-transformers layout and why, the loading snippet, the loading
    arguments): native modules load without `trust_remote_code`, the custom module needs it."""
    layout = record["sentence_transformers"]
    if layout["format"] == "custom":
        line = ("* sentence-transformers: the custom module `promptemb_st_module.py` (trust_remote_code=True): "
                f"{layout['reason']}")
        use = ["# sentence-transformers >= 5.0 (the module subclasses its InputModule); no promptemb install needed",
               "model = SentenceTransformer(DIR, trust_remote_code=True)  # runs promptemb_st_module.py from DIR"]
        return line, use, ", trust_remote_code=True"
    prompt = layout["prompt"]
    line = (f"* sentence-transformers: native modules (Transformer + Pooling('{layout['pooling_mode']}'), "
            f"max_seq_length {layout['max_seq_length']}"
            + (f", prompt {prompt!r}" if prompt else "")
            + f"), no custom code: {layout['reason']}")
    use = ["model = SentenceTransformer(DIR)  # standard modules: no trust_remote_code"]
    if prompt:
        use.append(f"# the template's prefix is the model's prompt ({prompt!r}): encode, encode_query and "
                   "encode_document all prepend it")
    return line, use, ""


def model_card(record: dict, scores: dict | None, score_source: str | None) -> str:
    source = record["source"]
    st_line, st_use, st_arguments = sentence_transformers_use(record)
    soft = "no"
    if record["soft_template"]:
        soft = f"yes, {record['soft_template']['size']} trained vectors written into the input embeddings"
    deep = "no"
    if record.get("deep_prompt"):
        deep = (f"yes, {record['deep_prompt']['length']} trained key/value positions prepended to every layer's "
                "self-attention, the tokens' positions starting after them")
    if record.get("llm2vec"):
        instruction = record["llm2vec"]["instruction"].strip()
        after = f" after the instruction `{instruction}`" if instruction else ""
        layout = ("A decoder (causal LM) turned into a sentence encoder by an LLM2Vec recipe (BehnamGhader et al. "
                  f"2024): it reads the plain sentence{after} in LLM2Vec's input format with bidirectional attention; "
                  "only the sentence's tokens are pooled.")
    elif record.get("decoder"):
        layout = ("A prompt-based sentence embedding of a decoder (causal LM). The sentence fills the template, which "
                  "is tokenized as one string with the tokenizer's own special tokens; only the sentence is truncated "
                  "(the template's last token, the pooled one, always stays); padding on either side gives the "
                  "same embeddings (position ids count real tokens).")
    else:
        layout = ("A prompt-based sentence encoder trained with promptemb. The sentence is placed in a template at the "
                  "token level (`[CLS] prefix sentence suffix [SEP]`; only the sentence is truncated) and pooled as "
                  "below.")
    adapter = record.get("adapter")
    lines = [
        "---",
        "library_name: sentence-transformers",
        "pipeline_tag: sentence-similarity",
        "tags: [sentence-transformers, sentence-similarity, feature-extraction, promptemb, promptbert]",
        "---",
        "",
        f"# {(source.get('module') or 'template').rsplit('.', 1)[-1]} on `{source.get('base_model')}` "
        "(promptemb export)",
        "",
        layout,
        "",
        f"* template: `{record['template']}` (sentence rule: `{record['sentence_rule']}`)" if record["template"] else
        "* template: none (the plain sentence)",
        f"* pooler: {describe_pooler(record)}",
        f"* soft template (OptiPrompt): {soft}",
        f"* deep prompts (DCPCSE): {deep}",
        *([f"* LoRA adapter kept (`{adapter['dir']}/`, peft): applied to base model `{adapter['base_model']}`, "
           f"whose weights must hash to sha256 `{adapter['base_weights_sha256']}`; needs `pip install peft`"]
          if adapter else []),
        f"* max length {record['max_length']} tokens, sentence truncated to {record['max_sentence_tokens']} tokens",
        st_line,
        *([f"* Matryoshka training: widths {source['matryoshka']['dims']} (weights "
           f"{source['matryoshka']['weights']}): the first d components are an embedding of their own, e.g. "
           f"`SentenceTransformer(DIR{st_arguments}, truncate_dim={source['matryoshka']['dims'][-1]})`"]
          if source.get("matryoshka") else []),
        *([f"* hard negatives mined by `{mined[0]['encoder']['name_or_path']}` "
           f"({mined[0]['encoder']['pooler']} pooling; settings and source checksums in config.json's "
           "`promptemb.source.training_data.mined`)"]
          if (mined := [m for m in (source.get("training_data") or {}).get("mined") or [] if m]) else []),
        f"* source checkpoint: `{source.get('checkpoint')}` (sha256 `{source.get('checkpoint_sha256')}`, "
        f"step {source.get('global_step')}), promptemb {record['framework_version']}" if source.get("checkpoint") else
        f"* source: the plain model `{source.get('base_model')}` (not trained by promptemb), promptemb "
        f"{record['framework_version']}",
        "",
        "## Use",
        "",
        "```python",
        "from sentence_transformers import SentenceTransformer",
        *st_use,
        "embeddings = model.encode([\"A man is playing a guitar.\"])",
        "```",
        "",
        "With promptemb installed (the framework's own encoder and poolers):",
        "",
        "```python",
        "from promptemb.inference import load_encoder",
        "embeddings = load_encoder(DIR).encode([\"A man is playing a guitar.\"])",
        "```",
        "",
        "`transformers.AutoModel.from_pretrained(DIR)` loads the transformer; the template, pooler and layers it needs "
        "are recorded in the `promptemb` block of config.json (plain AutoModel outputs are NOT these embeddings).",
        "",
    ]
    hashes = record.get("weights_sha256") or {}
    if hashes:
        lines += ["## Weights", "",
                  "sha256 of each weight file as exported (also in config.json's `promptemb.weights_sha256`); "
                  "`load_encoder` and `evaluate.py` refuse a directory whose files differ:", ""]
        lines += [f"* `{name}`: `{digest}`" for name, digest in sorted(hashes.items())] + [""]
    if scores:
        lines += ["## STS (cosine, Spearman x100, SentEval 'all' setting)", "", f"Source: {score_source}.", "",
                  markdown_table(scores)]
    else:
        lines += ["## STS", "", "No scores recorded for this checkpoint (export with `score=true` to add STS-B test).",
                  ""]
    return "\n".join(lines)
