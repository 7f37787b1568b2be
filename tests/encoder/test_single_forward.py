"""Scoring many poolers costs one transformer forward per (unique sentence, input form)."""

from collections import Counter

from promptemb.data.tasks import get_tasks, load_registry
from promptemb.encoder.model import Encoder
from promptemb.encoder.template import Template
from promptemb.evaluation.scoring_options import ScoringOptions
from promptemb.evaluation.sts import evaluate_sts
from promptemb.poolers import build_poolers

PROMPT = 'This sentence : "[X]" means [MASK] .'


def test_encoder_runs_once_per_sentence_and_form(mini_data, tiny_bert):
    root, registry = mini_data
    tasks = get_tasks(["MINI12", "MINI-B", "MINI-SICK"], load_registry(registry))
    encoder = Encoder(str(tiny_bert), batch_size=3, progress=False)
    seen = Counter()

    def record(module, args, kwargs):
        rows = kwargs["input_ids"].tolist()
        # a batch without padding is run without an attention mask: every token is real
        mask = kwargs["attention_mask"]
        masks = mask.tolist() if mask is not None else [[1] * len(row) for row in rows]
        for row, row_mask in zip(rows, masks):
            seen[tuple(t for t, m in zip(row, row_mask) if m)] += 1

    handle = encoder.transformer.register_forward_pre_hook(record, with_kwargs=True)
    try:
        poolers = build_poolers(["cls", "mean", "first_last", "static", "mask", "avg"])
        evaluate_sts(encoder, tasks, root, poolers, ScoringOptions(Template(PROMPT)))
    finally:
        handle.remove()
    unique = {s for t in tasks for p in [t.load(root)] for s in p.sentences1 + p.sentences2}
    tokenizer = encoder.tokenizer
    plain = {tuple(tokenizer(s)["input_ids"]) for s in unique}
    templated = {tuple(tokenizer(PROMPT.replace("[X]", s))["input_ids"]) for s in unique}
    assert len(unique) < sum(2 * t.pairs for t in tasks)  # sentences repeat across and within tasks
    assert set(seen) == plain | templated
    assert all(count == 1 for count in seen.values())
    assert encoder.stats.forward_sequences == 2 * len(unique)
