"""README.md of an export: what the model is, how to load it, and its STS scores when known."""

from __future__ import annotations

from promptemb.evaluation.report import markdown_table


def describe_pooler(record: dict) -> str:
    pooler = record["pooler"]
    if pooler["name"] == "avg":
        return f"`avg`: mean of layer {pooler['layer']} over all tokens of the templated input (template included)"
    text = f"`mask`: layer {pooler['layer']} state at the template's [MASK]"
    if pooler["head"] and pooler["head"].get("after_denoise"):
        return text + (", minus the template bias (template denoising: the [MASK] state of the template alone with "
                       "positions shifted by the sentence length), through the trained head tanh(W x + b)")
    if pooler["head"]:
        text += ", through the trained MLM-transform head (dense + activation + LayerNorm)"
    if pooler["denoise"]:
        text += ", minus the template bias (template denoising: the [MASK] state of the template alone with positions "
        text += "shifted by the sentence length)"
    return text


def model_card(record: dict, scores: dict | None, score_source: str | None) -> str:
    source = record["source"]
    soft = "no"
    if record["soft_template"]:
        soft = f"yes, {record['soft_template']['size']} trained vectors written into the input embeddings"
    lines = [
        "---",
        "library_name: sentence-transformers",
        "pipeline_tag: sentence-similarity",
        "tags: [sentence-transformers, sentence-similarity, feature-extraction, promptemb, promptbert]",
        "---",
        "",
        f"# {source.get('module', 'promptemb').rsplit('.', 1)[-1]} on `{source.get('base_model')}` (promptemb export)",
        "",
        "A prompt-based sentence encoder trained with promptemb. The sentence is placed in a template at the token "
        "level (`[CLS] prefix sentence suffix [SEP]`; only the sentence is truncated) and pooled as below.",
        "",
        f"* template: `{record['template']}` (sentence rule: `{record['sentence_rule']}`)",
        f"* pooler: {describe_pooler(record)}",
        f"* soft template (OptiPrompt): {soft}",
        f"* max length {record['max_length']} tokens, sentence truncated to {record['max_sentence_tokens']} tokens",
        f"* source checkpoint: `{source.get('checkpoint')}` (sha256 `{source.get('checkpoint_sha256')}`, "
        f"step {source.get('global_step')}), promptemb {record['framework_version']}",
        "",
        "## Use",
        "",
        "```python",
        "from sentence_transformers import SentenceTransformer",
        "# sentence-transformers >= 5.0 (the module subclasses its InputModule); no promptemb install needed",
        "model = SentenceTransformer(DIR, trust_remote_code=True)   # runs promptemb_st_module.py from this directory",
        "embeddings = model.encode([\"A man is playing a guitar.\"])",
        "```",
        "",
        "With promptemb installed (the framework's own encoder and poolers):",
        "",
        "```python",
        "from inference import load_encoder",
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
