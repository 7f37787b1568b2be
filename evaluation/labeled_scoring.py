"""What the labelled families (SentEval transfer, short-text clustering) share: their tasks read as labelled splits
(data/labeled_readers.py), each split's sentences (and a pair task's partners) indexed into the pass's sentence
index. They score through the same spine as STS (evaluation/family.py): one forward per unique sentence and input
form, every pooler at once, the same pooler plans (idf fitted per task on "T") and post-processor variants (fitted on
each task's own sentences for "T", else on the named corpus); evaluation/transfer.py and evaluation/clustering.py
score a task from its rows.

A task's sentence truncation is the tighter of the run's `max_sentence_tokens` and the task's own (clustering: 62,
the reference's 64-token inputs less [CLS]/[SEP]); tasks that share a truncation share one sentence index and pass.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from promptemb.data.labeled_readers import LabeledSplit
from promptemb.data.tasks import TaskSpec
from promptemb.evaluation.family import EvaluationFamily, IndexedTask

#: the suffix of a pair split's second sentences among a task's sentence lists (`train` and `train:partner`)
PARTNER = ":partner"


@dataclass
class LabeledTask(IndexedTask):
    """A transfer or clustering task in the sentence index; `data`: split name -> labelled examples."""

    @property
    def splits(self) -> dict[str, dict]:
        """split -> {"left": index rows of its sentences, "right": of their partners (pair tasks) or None,
        "labels"}."""
        return {name: {"left": self.ids[name], "right": self.ids.get(name + PARTNER), "labels": split.labels}
                for name, split in self.data.items()}


class LabeledFamily(EvaluationFamily):
    """A family whose tasks are labelled splits (`TaskSpec.load_labeled`)."""

    primary_metric = "accuracy"
    task_type = LabeledTask

    def read(self, spec: TaskSpec, root: Path) -> dict[str, LabeledSplit]:
        return spec.load_labeled(root)

    def sentences(self, data: dict[str, LabeledSplit]) -> dict[str, list[str]]:
        lists = {}
        for name, split in data.items():
            lists[name] = split.sentences
            if split.is_pairs:
                lists[name + PARTNER] = split.sentences2
        return lists

    def describe_task(self, task: LabeledTask) -> dict:
        return {"examples": {name: len(split) for name, split in task.data.items()},
                "protocol": task.spec.record.get("protocol", self.name)}
