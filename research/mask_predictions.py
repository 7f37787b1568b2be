"""Interpretation: the top-k vocabulary tokens the MLM head predicts at the template's [MASK] for given sentences
(what PromptBERT reads off its [MASK] representation).

    python -m promptemb.research.mask_predictions --model DIR_WITH_MLM_HEAD [--template '...'] [--top-k 10]
        (--sentences "a man is playing a guitar ." ... | --input FILE) [--output-dir results/research/mask_predictions]

Needs a checkpoint with a trained masked-language-model head; a model without one (e.g. all-MiniLM-L6-v2) is refused
with one line. Writes mask_predictions.json and mask_predictions.md.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from promptemb.common.errors import ConfigError, exit_on_user_error
from promptemb.data.readers import read_sentences
from promptemb.encoder.model import Encoder
from promptemb.encoder.outputs import EncoderOutput
from promptemb.encoder.template import SENTENCE_RULES, Template
from promptemb.evaluation.report import software_versions, utc_timestamp
from promptemb.poolers.base import Needs, Pooler, masked_mean
from promptemb.research.driver_outputs import markdown, write_outputs

DEFAULT_TEMPLATE = 'This sentence : "[X]" means [MASK] .'


class MaskPredictionPooler(Pooler):
    """p = softmax(MLM(h_M)) ∈ ℝ^V, h_M = the [MASK] state at `layer` averaged over the template's [MASK]s (as the
    `mask` pooler, PromptBERT Eq. 2); MLM = the checkpoint's head (transform + tied decoder), as in PromptBERT Eq. 3
    before its top-k truncation."""

    def __init__(self, name: str = "mask_predictions", layer: int = -1):
        super().__init__(name)
        self.layer = layer

    @property
    def needs(self) -> Needs:
        return Needs(layers=(self.layer,), templated=True, mask_token=True, mlm_head=True)

    def __call__(self, out: EncoderOutput) -> torch.Tensor:
        state = masked_mean(out.layer(self.layer), out.mask_token)
        return torch.softmax(out.mlm_head(state).float(), dim=-1)


def predict(encoder: Encoder, sentences: list[str], template: Template, top_k: int,
            sentence_rule: str = "none") -> list[dict]:
    """Per sentence: the `top_k` most probable tokens at [MASK], each with its probability."""
    if top_k < 1:
        raise ConfigError(f"--top-k must be >= 1, got {top_k}")
    pooler = MaskPredictionPooler()
    probabilities = torch.from_numpy(encoder.embed(sentences, [pooler], template, sentence_rule)[pooler.name])
    top = probabilities.topk(min(top_k, probabilities.shape[1]), dim=-1)
    return [{"sentence": sentence,
             "predictions": [{"token": token, "probability": float(p)} for token, p in
                             zip(encoder.tokenizer.convert_ids_to_tokens(ids.tolist()), values.tolist())]}
            for sentence, ids, values in zip(sentences, top.indices, top.values)]


@exit_on_user_error
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--template", default=DEFAULT_TEMPLATE)
    parser.add_argument("--sentence-rule", default="none", choices=SENTENCE_RULES)
    parser.add_argument("--sentences", nargs="*", default=None)
    parser.add_argument("--input", default=None, help="text file, one sentence per line")
    parser.add_argument("--top-k", type=int, default=10)
    parser.add_argument("--output-dir", default="results/research/mask_predictions")
    args = parser.parse_args(argv)
    sentences = list(args.sentences or []) + (read_sentences(Path(args.input)) if args.input else [])
    if not sentences:
        raise ConfigError("no sentences given; pass --sentences ... or --input FILE")
    template = Template(args.template)
    template.require_mask("promptemb.research.mask_predictions")
    encoder = Encoder(args.model, mlm_head=True, progress=False)  # refuses checkpoints without an MLM head
    rows = predict(encoder, sentences, template, args.top_k, args.sentence_rule)
    record = {"predictions": rows, "provenance": {"model": encoder.describe(), "template": template.text,
                                                  "sentence_rule": args.sentence_rule, "top_k": args.top_k,
                                                  "versions": software_versions(), "timestamp": utc_timestamp()}}
    table = markdown(["sentence", f"top-{args.top_k} tokens at [MASK] (probability)"],
                     [[row["sentence"], ", ".join(f"{p['token']} ({p['probability']:.3f})"
                                                  for p in row["predictions"])] for row in rows])
    json_path, md_path = write_outputs(Path(args.output_dir), "mask_predictions", record,
                                       f"[MASK] predictions, {args.model}, template `{template.text}`", table)
    print(table, end="")
    print(f"wrote {json_path} and {md_path}")


if __name__ == "__main__":
    main()
