"""A process building the pre-tokenized cache (test_fault_cache.py's concurrent builders): a module of its own, so
that a spawned child imports only what building needs."""

from __future__ import annotations

from pathlib import Path

from promptemb.data.pretokenized import SentenceTokenization, pretokenized_corpus
from promptemb.encoder.inputs import InputBuilder, InputForm
from promptemb.encoder.loading import load_pretrained
from promptemb.encoder.template import Template

SENTENCES = [f"sentence number {i} says {'something ' * (i % 7)}about item {i * 31 % 97} ." for i in range(3000)]
TEMPLATE = 'This sentence : "[X]" means [MASK] .'


def tokenization_of(model_dir: Path) -> SentenceTokenization:
    tokenizer = load_pretrained(str(model_dir))[0]
    return SentenceTokenization.for_builders([InputBuilder(tokenizer, InputForm(Template(TEMPLATE), "none", 16), 64)])


def build(model_dir: str, cache: str, queue) -> None:
    queue.put(len(pretokenized_corpus(SENTENCES, tokenization_of(Path(model_dir)), Path(cache))))
