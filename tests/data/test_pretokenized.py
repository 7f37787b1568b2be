"""Pre-tokenized training data: token-for-token the inputs of the on-the-fly path, the same training loss, a cache
keyed by what the ids depend on, and the optional length-grouped / duplicate-free orders (pure functions of
(seed, epoch))."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import torch

from promptemb.data.datamodules import TextLinesDataModule, TripletDataModule
from promptemb.data.pretokenized import (
    PretokenizedExamples,
    SentenceTokenization,
    pad_sentence_ids,
    pretokenized_corpus,
)
from promptemb.data.sampling import DataPosition, EpochSampler
from promptemb.encoder.inputs import InputBuilder, InputForm, collate
from promptemb.encoder.template import Template
from promptemb.lightning_modules.promptbert import PromptBERTSup, PromptBERTUnsup
from tests.lightning_modules.test_grad_cache import TRIPLETS

SENTENCES = ["A man plays a guitar", "short", "two dogs run in a field while a plane lands at night and the "
             "crowd watches the whole long show without a pause", "Is it raining?", "the sun is shining .",
             "a child reads a book on the sofa", "stocks fell sharply on monday", "short"]
#: Text a tokenizer front end could treat differently: special-token text, accents, other scripts, odd spacing.
TRICKY = ["a [MASK] in the text <mask> and [SEP]", "Café Zürich naïve résumé", "日本語の文 ελληνικά", "  spaced\tout  ",
          "", "ends with a quote\"", "Is it?", "x" * 300]
TEMPLATES = ['This sentence : "[X]" means [MASK] .', 'This sentence : "[X]" means [MASK] [MASK] .', "[X] [MASK]",
             "[MASK] [X]"]


def assert_same_batch(got, want) -> None:
    for name, value in vars(want).items():
        other = getattr(got, name)
        assert (value is None and other is None) or torch.equal(other, value), name


@pytest.mark.parametrize("model", ["tiny_bert", "tiny_roberta"])
@pytest.mark.parametrize("template", TEMPLATES)
@pytest.mark.parametrize("rule", ["none", "promptbert"])
def test_wrapped_ids_equal_the_on_the_fly_inputs(model, template, rule, request):
    """Stored ids (cut to max+1), padded by the loader's collate and wrapped on the device, equal
    collate(build(sentences)) token for token, truncation included."""
    from promptemb.encoder.loading import load_pretrained

    tokenizer = load_pretrained(str(request.getfixturevalue(model)))[0]
    for max_tokens in (None, 4):
        builder = InputBuilder(tokenizer, InputForm(Template(template), rule, max_tokens), 64)
        want = collate(builder.build(SENTENCES), tokenizer.pad_token_id, tokenizer.mask_token_id)
        tokenization = SentenceTokenization.for_builders([builder])
        stored = tokenization(SENTENCES)
        # what worker processes compute from the Rust backend alone, without transformers
        assert tokenization.sentence_ids()(SENTENCES + TRICKY) == tokenization(SENTENCES + TRICKY)
        assert max(len(ids) for ids in stored) <= builder.max_sentence_tokens + 1
        assert [i.truncated for i in builder.build_from_ids(stored)] == [i.truncated for i in builder.build(SENTENCES)]
        padded = pad_sentence_ids(stored)
        assert_same_batch(builder.wrap_padded_ids(padded["ids"], padded["lengths"]), want)


def _corpus(tmp_path: Path) -> Path:
    path = tmp_path / "corpus.txt"
    path.write_text("\n".join(SENTENCES * 3) + "\n")
    return path


def _datamodule(tmp_path: Path, **kwargs) -> TextLinesDataModule:
    return TextLinesDataModule([str(_corpus(tmp_path))], batch_size=4, held_out_tasks=[], cache_dir=str(tmp_path),
                               seed=3, **kwargs)


def test_pretokenized_loader_gives_the_same_loss_as_raw_sentences(tiny_bert, tmp_path):
    """Same batches, same inputs, same InfoNCE (dropout replayed from one seed), with 2 loader workers."""
    torch.manual_seed(0)
    module = PromptBERTUnsup(str(tiny_bert), sentence_rule="promptbert", max_sentence_tokens=6)
    raw = _datamodule(tmp_path, pretokenize=False)
    fed = _datamodule(tmp_path, pretokenize=True, num_workers=2)
    for dm in (raw, fed):
        dm.use_tokenization(module.sentence_tokenization())
        dm.setup("fit")
    assert isinstance(fed.dataset, PretokenizedExamples) and raw.dataset is raw.examples
    fed_batches, raw_batches = list(fed.train_dataloader()), list(raw.train_dataloader())
    assert len(fed_batches) == len(raw_batches) == 6
    for fed_batch, raw_batch in zip(fed_batches, raw_batches, strict=True):
        assert isinstance(raw_batch[0], str) and set(fed_batch) == {"ids", "lengths"}
        for builder in module.builders:
            assert_same_batch(module.view_batch(fed_batch, builder), module.view_batch(raw_batch, builder))
        losses = []
        for batch in (fed_batch, raw_batch):
            torch.manual_seed(1)
            losses.append(module.contrastive_loss(batch)[0])
        assert torch.equal(losses[0], losses[1])
    # the recipe's sentence limit (6 tokens) is counted once over the corpus; the raw path does not tokenize ahead
    longer = sum(len(ids) > 6 for ids in module.builders[0].tokenize_sentences(list(fed.examples)))
    assert fed.truncated_sentences == longer > 0 and raw.truncated_sentences == 0


def test_triplets_pretokenized_give_the_same_views(tiny_bert, tmp_path):
    path = tmp_path / "nli.csv"
    path.write_text("sent0,sent1,hard_neg\n" + "".join(",".join(t) + "\n" for t in TRIPLETS))
    torch.manual_seed(0)
    module = PromptBERTSup(str(tiny_bert)).eval()
    batches = []
    for pretokenize in (True, False):
        dm = TripletDataModule(str(path), batch_size=2, held_out_tasks=[], cache_dir=str(tmp_path),
                               pretokenize=pretokenize)
        dm.use_tokenization(module.sentence_tokenization())
        dm.setup("fit")
        batches.append(next(iter(dm.train_dataloader())))
    assert batches[0]["ids"].shape[:2] == (2, 3) and batches[0]["lengths"].shape == (2, 3)
    with torch.no_grad():
        views = [module.contrastive_views(batch) for batch in batches]
    for got, want in zip(*views, strict=True):
        assert torch.equal(got, want)


def test_cache_is_reused_and_keyed_by_what_the_ids_depend_on(tiny_bert, tmp_path):
    from promptemb.encoder.loading import load_pretrained

    tokenizer = load_pretrained(str(tiny_bert))[0]
    form = InputForm(Template(TEMPLATES[0]), "none", 8)
    tokenization = SentenceTokenization.for_builders([InputBuilder(tokenizer, form, 64)])
    first = pretokenized_corpus(SENTENCES, tokenization, tmp_path)
    built = sorted((tmp_path / "pretokenized").iterdir())
    assert len(built) == 1 and first[1]["ids0"] == tokenization(SENTENCES[1:2])[0]
    stamp = (built[0] / "key.json").stat().st_mtime_ns
    again = pretokenized_corpus(list(SENTENCES), tokenization, tmp_path)
    assert len(again) == len(SENTENCES) and (built[0] / "key.json").stat().st_mtime_ns == stamp
    other_rule = SentenceTokenization.for_builders([InputBuilder(tokenizer, InputForm(Template(TEMPLATES[0]),
                                                                                    "promptbert", 8), 64)])
    pretokenized_corpus(SENTENCES, other_rule, tmp_path)
    pretokenized_corpus(SENTENCES[:-1], tokenization, tmp_path)
    pretokenized_corpus(SENTENCES, SentenceTokenization(tokenization.builder, 3), tmp_path)
    assert len(list((tmp_path / "pretokenized").iterdir())) == 4  # rule, corpus, length: each its own cache
    assert not [p for p in (tmp_path / "pretokenized").iterdir() if p.name.startswith(".")]  # no staging left


def _batches(sampler: EpochSampler, size: int) -> list[list[int]]:
    order = list(sampler)
    return [order[i : i + size] for i in range(0, len(order), size)]


def test_length_grouping_keeps_the_epoch_and_reduces_padding():
    lengths = torch.randint(1, 60, (400,), generator=torch.Generator().manual_seed(0)).tolist()
    plain = EpochSampler(400, 8, seed=5, rank=0, world_size=2)
    grouped = [EpochSampler(400, 8, seed=5, rank=r, world_size=2, lengths=lengths) for r in range(2)]
    # the same examples per epoch (over both ranks), a different order, a function of (seed, epoch) only
    assert sorted(grouped[0].epoch_order(1) + grouped[1].epoch_order(1)) == sorted(
        plain.epoch_order(1) + EpochSampler(400, 8, seed=5, rank=1, world_size=2).epoch_order(1))
    assert grouped[0].epoch_order(1) == EpochSampler(400, 8, 5, 0, 2, lengths=lengths).epoch_order(1)
    assert grouped[0].epoch_order(1) != grouped[0].epoch_order(2)

    def padding(batches):
        return sum(max(lengths[i] for i in b) * len(b) - sum(lengths[i] for i in b) for b in batches)

    assert padding(_batches(grouped[0], 8)) < padding(_batches(plain, 8)) / 4
    resumed = EpochSampler(400, 8, 5, 0, 2, DataPosition(0, 7), lengths=lengths)
    assert list(resumed) == list(grouped[0])[7 * 8:]


def test_distinct_batches_remove_duplicate_anchors_when_possible():
    keys = [i % 150 for i in range(240)]  # 90 sentences occur twice

    def global_batches(epoch, keys=keys):
        ranks = [EpochSampler(240, 6, 1, r, 2, keys=keys).epoch_order(epoch) for r in range(2)]
        return [ranks[0][i : i + 6] + ranks[1][i : i + 6] for i in range(0, 240 // 2, 6)]

    assert any(len({keys[i] for i in b}) < 12 for b in global_batches(0, keys=None))
    batches = global_batches(0)
    assert all(len({keys[i] for i in b}) == 12 for b in batches)
    assert Counter(i for b in batches for i in b) == Counter(range(240))  # every example once
    assert batches == global_batches(0) and batches != global_batches(1)
    resumed = EpochSampler(240, 6, 1, 0, 2, DataPosition(0, 3), keys=keys)
    assert list(resumed) == EpochSampler(240, 6, 1, 0, 2, keys=keys).epoch_order(0)[18:]
    # nothing to swap with: the order stays as it was
    assert global_batches(0, keys=[0] * 240) == global_batches(0, keys=None)


def test_datamodule_sampling_options_reach_the_sampler(tiny_bert, tmp_path):
    torch.manual_seed(0)
    module = PromptBERTUnsup(str(tiny_bert))
    dm = _datamodule(tmp_path, group_by_length=True, distinct_in_batch=True)
    dm.use_tokenization(module.sentence_tokenization())
    dm.setup("fit")
    assert dm.example_lengths().tolist() == [len(ids) for ids in module.sentence_tokenization()(list(dm.examples))]
    sampler = dm.train_dataloader().sampler
    assert sampler.lengths is not None and sampler.keys == dm.duplicate_keys().tolist()
    for batch in dm.train_dataloader():  # 7 distinct sentences, batches of 4: never a duplicate in a batch
        rows = [tuple(ids[:n].tolist()) for ids, n in zip(batch["ids"], batch["lengths"], strict=True)]
        assert len(set(rows)) == len(rows)
