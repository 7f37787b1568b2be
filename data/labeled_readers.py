"""Readers for labelled tasks: SentEval transfer tasks and short-text clustering sets.

Transfer files are read exactly as SentEval reads them (encoding per task record; a sentence is
`" ".join(line.split())`; a blank line is an example with the empty sentence, as in SentEval), and each split is put in
SentEval's order: sorted by (token count, label), or (tokens of A, tokens of B, label) for pairs, stable. The order
matters: SentEval's stratified folds are drawn over it, so the same order gives the same folds.

Clustering files are `label<TAB>text`, split on the first tab (one stackoverflow text holds a tab; most of its lines
end with an empty trailing field); CRLF line ends are accepted. Labels map to 0..k-1 in sorted order.

Every malformed line raises `DataError` naming `file:line`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from promptemb.common.errors import DataError

SICK_LABELS = {"CONTRADICTION": 0, "NEUTRAL": 1, "ENTAILMENT": 2}
TREC_LABELS = {"ABBR": 0, "DESC": 1, "ENTY": 2, "HUM": 3, "LOC": 4, "NUM": 5}


@dataclass
class LabeledSplit:
    """Labelled examples of one split: single sentences, or pairs when `sentences2` is set."""

    sentences: list[str]
    labels: np.ndarray
    sentences2: list[str] | None = None

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def is_pairs(self) -> bool:
        return self.sentences2 is not None

    def all_sentences(self) -> list[str]:
        return self.sentences + (self.sentences2 or [])


def _lines(path: Path, encoding: str) -> list[str]:
    try:
        return path.read_text(encoding=encoding).splitlines()
    except UnicodeDecodeError as err:
        raise DataError(f"{path}: not valid {encoding} ({err.reason} at byte {err.start})") from None


def _join(text: str) -> str:
    return " ".join(text.split())


def _senteval_order(split: LabeledSplit) -> LabeledSplit:
    """SentEval's sort, stable: by token count(s), then label."""
    if split.is_pairs:
        keys = [(len(a.split()), len(b.split()), int(y)) for a, b, y in
                zip(split.sentences, split.sentences2, split.labels)]
    else:
        keys = [(len(s.split()), int(y)) for s, y in zip(split.sentences, split.labels)]
    order = sorted(range(len(keys)), key=keys.__getitem__)
    return LabeledSplit([split.sentences[i] for i in order], split.labels[order],
                        [split.sentences2[i] for i in order] if split.is_pairs else None)


def _label(value: str, names: dict[str, int], path: Path, lineno: int) -> int:
    if value not in names:
        raise DataError(f"{path}:{lineno}: unknown label {value!r}; expected one of {', '.join(names)}")
    return names[value]


def read_binary(positive: Path, negative: Path, encoding: str) -> LabeledSplit:
    """MR, CR, SUBJ, MPQA: one sentence per line; label 1 = the positive file, 0 = the negative one. A blank line is
    kept as an empty sentence (CR has 4, MPQA 3), as SentEval keeps it: its folds are drawn over every line, so
    dropping them would change every fold. The encoder embeds "" as [CLS] (template) [SEP]."""
    pos, neg = ([_join(line) for line in _lines(path, encoding)] for path in (positive, negative))
    for path, sentences in ((positive, pos), (negative, neg)):
        if not any(sentences):
            raise DataError(f"{path}: empty file; expected one sentence per line")
    return _senteval_order(LabeledSplit(pos + neg, np.asarray([1] * len(pos) + [0] * len(neg), dtype=np.int64)))


def read_sst(path: Path, encoding: str, fine: bool) -> LabeledSplit:
    """SST binary: `sentence<TAB>label`; SST fine: `label sentence`."""
    sentences, labels = [], []
    for lineno, line in enumerate(_lines(path, encoding), start=1):
        fields = line.strip().split(" ", 1) if fine else line.strip().split("\t")
        if len(fields) != 2:
            raise DataError(f"{path}:{lineno}: expected {'label SPACE sentence' if fine else 'sentence TAB label'}")
        text, value = (fields[1], fields[0]) if fine else (fields[0], fields[1])
        if not value.strip().isdigit():
            raise DataError(f"{path}:{lineno}: label {value!r} is not a class number")
        sentences.append(_join(text))
        labels.append(int(value))
    return _senteval_order(LabeledSplit(sentences, np.asarray(labels, dtype=np.int64)))


def read_trec(path: Path, encoding: str) -> LabeledSplit:
    """`COARSE:fine question`; the coarse class is the label."""
    sentences, labels = [], []
    for lineno, line in enumerate(_lines(path, encoding), start=1):
        target, _, rest = line.strip().partition(":")
        words = rest.split(" ", 1)
        if not rest or len(words) != 2:
            raise DataError(f"{path}:{lineno}: expected 'COARSE:fine question'")
        labels.append(_label(target, TREC_LABELS, path, lineno))
        sentences.append(_join(words[1]))
    return _senteval_order(LabeledSplit(sentences, np.asarray(labels, dtype=np.int64)))


def _read_pair_table(path: Path, encoding: str, columns: tuple[int, int, int], parse_label) -> LabeledSplit:
    """Header line, then tab-separated rows; `columns` = (sentence A, sentence B, label) field indices."""
    lines = _lines(path, encoding)
    if not lines:
        raise DataError(f"{path}: empty file; expected a header line and one pair per line")
    first, second, label = columns
    left, right, labels = [], [], []
    for lineno, line in enumerate(lines[1:], start=2):
        fields = line.strip().split("\t")
        if len(fields) <= max(columns):
            raise DataError(f"{path}:{lineno}: expected at least {max(columns) + 1} tab-separated fields, "
                            f"found {len(fields)}")
        left.append(_join(fields[first]))
        right.append(_join(fields[second]))
        labels.append(parse_label(fields[label].strip(), lineno))
    return _senteval_order(LabeledSplit(left, np.asarray(labels, dtype=np.int64), right))


def read_mrpc(path: Path, encoding: str) -> LabeledSplit:
    """`Quality<TAB>#1 ID<TAB>#2 ID<TAB>#1 String<TAB>#2 String`."""
    return _read_pair_table(path, encoding, (3, 4, 0), lambda value, lineno: _label(value, {"0": 0, "1": 1}, path,
                                                                                        lineno))


def read_sick_entailment(path: Path, encoding: str) -> LabeledSplit:
    """SICK: sentence_A, sentence_B, entailment_judgment (CONTRADICTION 0, NEUTRAL 1, ENTAILMENT 2)."""
    return _read_pair_table(path, encoding, (1, 2, 4), lambda value, lineno: _label(value, SICK_LABELS, path, lineno))


def read_clustering(path: Path) -> tuple[LabeledSplit, list[str]]:
    """`label<TAB>text` per line; returns the examples (labels 0..k-1) and the original label names, sorted."""
    raw_labels, texts = [], []
    for lineno, line in enumerate(_lines(path, "utf-8"), start=1):
        label, tab, text = line.partition("\t")
        if not tab or not label.strip():
            raise DataError(f"{path}:{lineno}: expected 'label<TAB>text', found no label field")
        sentence = _join(text)
        if not sentence:
            raise DataError(f"{path}:{lineno}: empty text after the label")
        raw_labels.append(label.strip())
        texts.append(sentence)
    if not texts:
        raise DataError(f"{path}: empty file; expected one 'label<TAB>text' line per example")
    names = sorted(set(raw_labels), key=lambda name: (not name.isdigit(), int(name) if name.isdigit() else 0, name))
    index = {name: i for i, name in enumerate(names)}
    return LabeledSplit(texts, np.asarray([index[name] for name in raw_labels], dtype=np.int64)), names
