"""Hard-negative mining for (anchor, positive) pairs, as sentence-transformers' `util.mine_hard_negatives` defines it
(its `output_format="triplet"`, cosine similarity, no cross-encoder), from embeddings the caller computed.

For every distinct anchor (first occurrence order) the candidates are the distinct corpus texts (the optional extra
corpus, then the positives) ranked by cosine similarity; of the top `range_max + max_positives` (`max_positives`:
the most rows any anchor has), the anchor's own positives are removed, then every candidate whose score breaks a
condition:

* `absolute_margin` m: score + m > p_min, with p_min the anchor's lowest positive score (its hardest positive);
* `relative_margin` r: score > p_min - |p_min| · r;
* `max_score` / `min_score`: score above / below them.

The best `range_max` left are ranked, the first `range_min` skipped, and `num_negatives` taken: the best ones
(`sampling_strategy="top"`), or drawn without replacement from those still valid (`"random"`, Python's
`random.sample` on a `random.Random(seed)`: the draws sentence-transformers makes after `random.seed(seed)`), then
re-ranked by score. Each (anchor, positive) pair of the anchor gets one triplet per negative found; an anchor
with fewer valid candidates gets fewer triplets.

Default ranges as sentence-transformers': without a margin or score bound `range_max = range_min + num_negatives +
max_positives`, with one `range_min + 10 · num_negatives + max_positives`. `exclude_anchor` (the default) removes the
anchor's own text from its candidates and widens the window by one for it: sentence-transformers' semantics from
6.3 on (in sentence-pair data a sentence is often an anchor in one pair and a positive in another; a negative equal
to its anchor is a column InfoNCE cannot learn from). `exclude_anchor=False` is the semantics before 6.3, where the
anchor's text stayed a candidate. Both are exact for their release (tests/data/test_hard_negatives.py compares with
the installed one). Scores are cosine similarities in [-1, 1], so margins and score bounds outside their ranges are
refused.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F

from promptemb.common.errors import ConfigError

SamplingStrategy = Literal["top", "random"]
SAMPLING_STRATEGIES = ("top", "random")
#: queries scored against the corpus at once (sentence-transformers' `faiss_batch_size`, its exact-search chunk)
QUERY_CHUNK = 16384


@dataclass(frozen=True)
class MiningSettings:
    """sentence-transformers' names and defaults (`margin`, deprecated there, is not taken: `absolute_margin`)."""

    range_min: int = 0
    range_max: int | None = None
    max_score: float | None = None
    min_score: float | None = None
    absolute_margin: float | None = None
    relative_margin: float | None = None
    num_negatives: int = 3
    sampling_strategy: SamplingStrategy = "top"
    seed: int = 12
    exclude_anchor: bool = True

    def __post_init__(self) -> None:
        """One line for each value outside its range, before any data is read or model loaded."""
        integer = lambda v: isinstance(v, int) and not isinstance(v, bool)  # noqa: E731
        number = lambda v: isinstance(v, int | float) and not isinstance(v, bool) and np.isfinite(v)  # noqa: E731
        if not integer(self.range_min) or self.range_min < 0:
            raise ConfigError(f"range_min={self.range_min!r}: must be an integer >= 0 (ranks skipped at the top)")
        if self.range_max is not None and (not integer(self.range_max) or self.range_max <= self.range_min):
            raise ConfigError(f"range_max={self.range_max!r} must be an integer > range_min={self.range_min}")
        if not integer(self.num_negatives) or self.num_negatives < 1:
            raise ConfigError(f"num_negatives={self.num_negatives!r}: must be an integer >= 1")
        if self.sampling_strategy not in SAMPLING_STRATEGIES:
            raise ConfigError(f"sampling_strategy={self.sampling_strategy!r}; valid: {', '.join(SAMPLING_STRATEGIES)}")
        if not integer(self.seed) or not 0 <= self.seed <= 2**32 - 1:
            raise ConfigError(f"seed={self.seed!r}: must be an integer from 0 to 4294967295")
        bounds = {"absolute_margin": (0.0, 2.0, "a cosine difference"), "relative_margin": (0.0, 1.0, "a fraction of "
                  "the positive score"), "max_score": (-1.0, 1.0, "a cosine"), "min_score": (-1.0, 1.0, "a cosine")}
        for name, (low, high, what) in bounds.items():
            value = getattr(self, name)
            if value is not None and (not number(value) or not low <= value <= high):
                raise ConfigError(f"{name}={value!r} is out of range: {name} is {what}, from {low:g} to {high:g}")
        if self.min_score is not None and self.max_score is not None and self.min_score >= self.max_score:
            raise ConfigError(f"min_score={self.min_score} >= max_score={self.max_score} leaves no candidate; use "
                              "min_score < max_score")
        if self.range_max is not None:
            self.resolved_range_max(0)

    @property
    def filters(self) -> bool:
        return any(v is not None for v in (self.absolute_margin, self.relative_margin, self.max_score))

    def resolved_range_max(self, max_positives: int) -> int:
        """sentence-transformers' default: room for the positives, and 10x the negatives when candidates may be
        filtered out; a window too narrow for `num_negatives` is refused (before any embedding)."""
        range_max = self.range_max
        if range_max is None:
            per_negative = 10 if self.filters else 1
            range_max = self.range_min + per_negative * self.num_negatives + max_positives
        if self.num_negatives > range_max - self.range_min:
            raise ConfigError(f"cannot mine num_negatives={self.num_negatives} per anchor: range_min={self.range_min} "
                              f"and range_max={range_max} leave {range_max - self.range_min} candidates; lower "
                              "num_negatives or widen the range")
        return range_max


@dataclass
class PairIndex:
    """Distinct anchors (first occurrence order), the distinct candidate texts, and each anchor's positives."""

    anchors: list[str]
    corpus: list[str]
    positives: list[list[int]]  # per anchor: corpus indices of its distinct positives, first occurrence order
    max_positives: int  # the most (anchor, positive) rows of one anchor, repeated rows included

    @classmethod
    def build(cls, pairs: Sequence[tuple[str, str]], corpus: Sequence[str] | None = None) -> PairIndex:
        if not pairs:
            raise ConfigError("no (anchor, positive) pairs to mine negatives for")
        positives_in_order = [positive for _, positive in pairs]
        texts = list(dict.fromkeys([*(corpus or ()), *positives_in_order]))
        position = {text: index for index, text in enumerate(texts)}
        anchor_index: dict[str, int] = {}
        rows: dict[str, int] = {}
        positives: list[list[int]] = []
        for anchor, positive in pairs:
            if anchor not in anchor_index:
                anchor_index[anchor] = len(anchor_index)
                positives.append([])
            rows[anchor] = rows.get(anchor, 0) + 1
            own = positives[anchor_index[anchor]]
            if position[positive] not in own:
                own.append(position[positive])
        return cls(list(anchor_index), texts, positives, max(rows.values()))


@dataclass
class MinedTriplets:
    """The triplets, with the scores and counts a run reports."""

    triplets: list[tuple[str, str, str]]
    positive_scores: list[float] = field(default_factory=list)  # one per triplet
    negative_scores: list[float] = field(default_factory=list)
    skipped: dict[str, int] = field(default_factory=dict)  # candidates removed by each condition
    anchors: int = 0
    anchors_short: int = 0  # anchors with fewer than num_negatives valid negatives
    range_max: int = 0

    def statistics(self) -> dict:
        def summary(values: list[float]) -> dict | None:
            if not values:
                return None
            array = np.asarray(values, dtype=np.float64)
            return {"mean": float(array.mean()), "std": float(array.std()), "min": float(array.min()),
                    "median": float(np.median(array)), "max": float(array.max())}

        differences = [p - n for p, n in zip(self.positive_scores, self.negative_scores, strict=True)]
        return {"triplets": len(self.triplets), "anchors": self.anchors, "anchors_with_fewer_negatives":
                self.anchors_short, "range_max": self.range_max, "skipped_candidates": dict(self.skipped),
                "positive_score": summary(self.positive_scores), "negative_score": summary(self.negative_scores),
                "difference": summary(differences)}


def cosine_scores(queries: torch.Tensor, corpus: torch.Tensor) -> torch.Tensor:
    """[Q, C] cosine similarities (rows normalised, as sentence-transformers' `cos_sim` of its normalised
    embeddings)."""
    return F.normalize(queries, p=2, dim=1) @ F.normalize(corpus, p=2, dim=1).T


def mine_hard_negatives(pairs: Sequence[tuple[str, str]], embed: Callable[[list[str]], np.ndarray | torch.Tensor],
                        settings: MiningSettings = MiningSettings(), corpus: Sequence[str] | None = None
                        ) -> MinedTriplets:
    """Triplets (anchor, positive, negative) for `pairs` (see the module docstring); `embed(texts)` returns one
    embedding row per text (any scale: rows are normalised here), called once, on the distinct anchor and candidate
    texts."""
    index = PairIndex.build(pairs, corpus)
    range_max = settings.resolved_range_max(index.max_positives)
    # every distinct text once; normalised, as sentence-transformers encodes with normalize_embeddings=True
    unique = list(dict.fromkeys([*index.anchors, *index.corpus]))
    rows_of = {text: row for row, text in enumerate(unique)}
    embedded = F.normalize(torch.as_tensor(np.asarray(embed(unique)), dtype=torch.float32), p=2, dim=1)
    if embedded.shape[0] != len(unique):
        raise ValueError(f"embed returned {embedded.shape[0]} rows for {len(unique)} texts")
    anchors = embedded[torch.tensor([rows_of[text] for text in index.anchors])]
    texts = embedded[torch.tensor([rows_of[text] for text in index.corpus])]
    # the anchor's own text takes no candidate slot when it is excluded
    extra = 1 if settings.exclude_anchor else 0
    width = range_max + index.max_positives + extra
    k = min(width, len(index.corpus))
    scores, indices = [], []
    for start in range(0, len(anchors), QUERY_CHUNK):
        top = torch.topk(cosine_scores(anchors[start:start + QUERY_CHUNK], texts), k=k, dim=1)
        scores.append(top.values)
        indices.append(top.indices)
    scores, indices = torch.cat(scores), torch.cat(indices)
    if width > k:  # fewer texts than the window: padded with index -1, score -inf
        scores = torch.cat([scores, scores.new_full((len(scores), width - k), -float("inf"))], dim=1)
        indices = torch.cat([indices, indices.new_full((len(indices), width - k), -1)], dim=1)
    positive_index = [torch.tensor(own) for own in index.positives]
    repeated = torch.tensor([a for a, own in enumerate(index.positives) for _ in own])
    positive_scores = (F.normalize(anchors[repeated], dim=1) * F.normalize(texts[torch.cat(positive_index)],
                                                                               dim=1)).sum(-1)
    scores[indices == -1] = -float("inf")
    scores[torch.stack([torch.isin(indices[a], positive_index[a]) for a in range(len(index.anchors))])] = -float("inf")
    if settings.exclude_anchor:
        position = {text: i for i, text in enumerate(index.corpus)}
        own_text = torch.tensor([position.get(anchor, -2) for anchor in index.anchors])
        scores[indices == own_text[:, None]] = -float("inf")
    skipped = {}
    candidates = scores.numel()
    if settings.absolute_margin is not None or settings.relative_margin is not None:
        hardest = torch.stack([positive_scores[repeated == a].min() for a in range(len(index.anchors))])
        if settings.absolute_margin is not None:
            removed = scores + settings.absolute_margin > hardest[:, None]
            scores[removed] = -float("inf")
            skipped["absolute_margin"] = int(removed.sum())
            candidates -= skipped["absolute_margin"]
        if settings.relative_margin is not None:
            removed = scores > (hardest - hardest.abs() * settings.relative_margin)[:, None]
            scores[removed] = -float("inf")
            skipped["relative_margin"] = int(removed.sum())
            candidates -= skipped["relative_margin"]
    for name, removed in (("max_score", None if settings.max_score is None else scores > settings.max_score),
                          ("min_score", None if settings.min_score is None
                           else (scores < settings.min_score) & ~scores.isneginf())):
        if removed is not None:
            scores[removed] = -float("inf")
            skipped[name] = int(removed.sum())
    rows = torch.arange(len(index.anchors)).unsqueeze(-1)
    negative_scores, local = torch.topk(scores, k=range_max, dim=1)
    negative_index = indices[rows, local]
    negative_scores, negative_index = negative_scores[:, settings.range_min:], negative_index[:, settings.range_min:]
    if settings.sampling_strategy == "top":
        negative_scores = negative_scores[:, :settings.num_negatives]
        negative_index = negative_index[:, :settings.num_negatives]
    else:
        draw = random.Random(settings.seed)
        valid = (negative_index.size(1) - negative_scores.isinf().sum(1)).clamp(min=settings.num_negatives)
        picked = [draw.sample(range(int(options)), k=settings.num_negatives) for options in valid]
        negative_scores, negative_index = negative_scores[rows, picked], negative_index[rows, picked]
        negative_scores, order = negative_scores.sort(dim=1, descending=True)
        negative_index = negative_index[rows, order]
    mined = MinedTriplets([], anchors=len(index.anchors), range_max=range_max, skipped=skipped)
    pair = 0
    for a, anchor in enumerate(index.anchors):
        found = [(int(n), float(s)) for n, s in zip(negative_index[a], negative_scores[a], strict=True)
                 if s != -float("inf")]
        mined.anchors_short += len(found) < settings.num_negatives
        for positive in index.positives[a]:
            for negative, score in found:
                mined.triplets.append((anchor, index.corpus[positive], index.corpus[negative]))
                mined.positive_scores.append(float(positive_scores[pair]))
                mined.negative_scores.append(score)
            pair += 1
    return mined


def settings_record(settings: MiningSettings, range_max: int) -> dict:
    """The settings as recorded in a mined file's provenance (range_max as resolved)."""
    semantics = ">=6.3" if settings.exclude_anchor else "<6.3"  # the releases whose selection it equals
    return {**asdict(settings), "range_max": range_max, "output_format": "triplet", "similarity": "cosine",
            "equals": f"sentence-transformers{semantics} util.mine_hard_negatives"}
