"""examples/small_family.py, an evaluation family of the user's own module (paraphrase retrieval over STS pairs):
its scores against a plain re-computation, evaluate.py from the user's directory with its tasks as data (mixed
with an STS task, its settings through family_args), its real task file against the data's checksums, and the
refusals: a task whose family is not registered, a family named like a built-in, a module that fails to import,
an unknown family or setting in family_args."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from promptemb.common.errors import ConfigError
from promptemb.data.tasks import get_tasks, load_registry
from promptemb.encoder.model import Encoder
from promptemb.evaluation.families import build_families
from promptemb.evaluation.scoring_options import ScoringOptions
from promptemb.poolers import build_poolers
from promptemb.postprocessing import build_posts
from tests.examples.helpers import EXAMPLES, evaluate_from, example_imported, user_directory
from tests.helpers import assert_one_line_error, sha256

FAMILY = "paraphrase_retrieval"
#: STS-B-formatted pairs: gold >= 4 makes a query; a second sentence shared by two pairs; a query that is also
#: another pair's second sentence (never its own answer); a pair just below the threshold.
PAIRS = [("5.000", "a man is playing a guitar .", "a man plays the guitar ."),
         ("4.200", "a woman slices onions .", "onions are being sliced by a woman ."),
         ("0.500", "a dog runs in the park .", "a man plays the guitar ."),
         ("4.600", "the stock market fell today .", "stocks dropped sharply today ."),
         ("1.000", "a child reads a book .", "a cat sleeps on the sofa ."),
         ("4.000", "stocks dropped sharply today .", "markets fell on monday ."),
         ("3.900", "two birds sing .", "birds are singing ."),
         ("4.800", "the sun is shining .", "it is a sunny day .")]


def write_retrieval_data(root: Path, registry_name: str = "retrieval_tasks.yaml") -> Path:
    """A retrieval task and an STS task on the same pairs under `root`, and their registry (with a group); returns
    the registry's path."""
    path = root / "downstream/retrieval/pairs.csv"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"main-x\tfile\t2024\t{i:04d}\t{gold}\t{a}\t{b}\n" for i, (gold, a, b) in enumerate(PAIRS)))
    file = {"path": "downstream/retrieval/pairs.csv", "sha256": sha256(path)}
    record = {"format": "stsb", "split": "test", "pairs": len(PAIRS), "file": file}
    registry = root / registry_name
    registry.write_text(yaml.safe_dump({"groups": {"retrieval": ["MINI-retrieval"]}, "tasks": {
        "MINI-retrieval": {"family": FAMILY, **record, "main_score": "recall_at_1"},
        "MINI-STS": {**record, "main_score": "spearman_cosine"}}}, sort_keys=False))
    return registry


def plain_ranks(embed, min_gold: float) -> list[int]:
    """Each query's rank of its partner, computed pair by pair with Python floats: the documents are the distinct
    second sentences, the query's own sentence among them is skipped unless it is the partner."""
    documents = list(dict.fromkeys(b for _, _, b in PAIRS))
    ranks = []
    for gold, query, partner in PAIRS:
        if float(gold) < min_gold:
            continue

        def cosine(a, b):
            u, v = embed[a].astype(float), embed[b].astype(float)
            return float(u @ v / (np.linalg.norm(u) * np.linalg.norm(v)))

        target = cosine(query, partner)
        others = [cosine(query, doc) for doc in documents if doc != partner and doc != query]
        ranks.append(1 + sum(score > target for score in others))
    return ranks


def test_retrieval_scores_equal_a_plain_recomputation(tiny_bert, tmp_path):
    registry = write_retrieval_data(tmp_path)
    encoder = Encoder(str(tiny_bert), progress=False)
    poolers = build_poolers(["mean", "cls"])
    sentences = list(dict.fromkeys(s for _, a, b in PAIRS for s in (a, b)))
    with example_imported("small_family"):
        family = build_families({FAMILY: {"min_gold": 4.0}})[FAMILY]
        tasks = get_tasks(["retrieval"], load_registry(registry))
        result = family(encoder, tasks, tmp_path, poolers, ScoringOptions(posts=build_posts(["zscore"], {})))
    assert set(result["scores"]) == {"mean", "cls", "mean+zscore(T)", "cls+zscore(T)"}
    assert result["protocol"] == {"metric": "recall_at_1", "min_gold": 4.0}
    assert result["tasks"]["MINI-retrieval"]["family"] == FAMILY
    assert result["unique_sentences"] == len(sentences)
    embeddings = encoder.embed(sentences, poolers)
    for pooler in ("mean", "cls"):
        ranks = plain_ranks(dict(zip(sentences, embeddings[pooler])), 4.0)
        record = result["details"][pooler]["MINI-retrieval"]
        assert record["queries"] == 5 and record["documents"] == 7
        assert record["recall_at_1"] == pytest.approx(100 * np.mean([rank == 1 for rank in ranks]), abs=1e-9)
        assert record["mrr"] == pytest.approx(100 * np.mean([1 / rank for rank in ranks]), abs=1e-9)
        assert result["scores"][pooler] == {"MINI-retrieval": record["recall_at_1"], "avg": record["recall_at_1"]}


def test_the_family_from_the_users_directory(tiny_bert, tmp_path):
    """evaluate.py imports=[small_family] task_registry=FILE run where the user keeps both files: the retrieval group
    beside an STS task of the same registry, the family's setting from family_args, one table and PNG per family."""
    data = tmp_path / "data"
    registry = write_retrieval_data(data)
    user = user_directory(tmp_path, "small_family.py")
    (user / "retrieval_tasks.yaml").write_text(registry.read_text())
    out = tmp_path / "out"
    proc = evaluate_from(user, "imports=[small_family]", "task_registry=retrieval_tasks.yaml",
                         "tasks=[retrieval,MINI-STS]", "poolers=[mean,cls]", f"backbone.name_or_path={tiny_bert}",
                         f"+family_args.{FAMILY}.min_gold=4.5", f"output_dir={out}", data_root=data)
    assert proc.returncode == 0, proc.stderr
    results = json.loads((out / "results.json").read_text())
    assert list(results["families"]) == ["sts", FAMILY]  # the built-ins first, whatever the task order
    block = results["families"][FAMILY]
    assert block["protocol"] == {"metric": "recall_at_1", "min_gold": 4.5}
    assert block["details"]["mean"]["MINI-retrieval"]["queries"] == 3
    assert results["provenance"]["tasks"]["MINI-retrieval"]["family"] == FAMILY
    assert "## Paraphrase retrieval" in (out / "results.md").read_text()
    assert (out / f"results_{FAMILY}.png").is_file() and (out / "results.png").is_file()
    with example_imported("small_family"):
        family = build_families({FAMILY: {"min_gold": 4.5}})[FAMILY]
        tasks = get_tasks(["MINI-retrieval"], load_registry(registry))
        expected = family(Encoder(str(tiny_bert), progress=False), tasks, data, build_poolers(["mean", "cls"]))
    assert block["scores"] == expected["scores"]


def test_the_examples_task_file_names_the_real_data(real_data_root, tiny_bert):
    """examples/small_family_tasks.yaml: every file is the data's (path and sha256 as SHA256SUMS lists them), and its
    STS-B task scores through the family on the real pairs (338 queries among 1,337 documents)."""
    lines = (real_data_root / "SHA256SUMS").read_text().splitlines()
    sums = {path.strip(): digest for digest, path in (line.split(None, 1) for line in lines)}
    registry = load_registry(EXAMPLES / "small_family_tasks.yaml")
    assert registry.groups["retrieval"] == ("STSB-retrieval", "SICK-retrieval")
    for spec in registry.values():
        assert spec.family == FAMILY
        for path, digest in spec.files().items():
            assert sums[path] == digest, path
    with example_imported("small_family"):
        family = build_families()[FAMILY]
        result = family(Encoder(str(tiny_bert), progress=False), get_tasks(["STSB-retrieval"], registry),
                        real_data_root, build_poolers(["mean"]))
    record = result["details"]["mean"]["STSB-retrieval"]
    assert (record["queries"], record["documents"]) == (338, 1337)
    assert 0 <= record["recall_at_1"] <= 100 and record["mrr"] >= record["recall_at_1"]


def test_family_args_name_a_registered_family_and_its_settings():
    with pytest.raises(ConfigError, match=r"^family_args\.transfr: there is no evaluation family 'transfr'; did you "
                                          r"mean transfer\? valid: sts, transfer, clustering \(a family of your own: "
                                          r"pass imports=\[MODULE\]"):
        build_families({"transfr": {"kfold": 2}})
    with pytest.raises(ConfigError, match=r"^family_args\.clustering\.trial is not a key of family_args\.clustering "
                                          r"\(ClusteringConfig\); did you mean family_args\.clustering\.trials\?"):
        build_families({"clustering": {"trial": 2}})
    with pytest.raises(ConfigError, match=r"^family_args\.sts: the sts family has no settings; drop family_args\.sts"):
        build_families({"sts": {"min_gold": 4}})


@pytest.mark.parametrize(("module", "source", "pattern"), [
    (None, None, r"^error: task MINI-retrieval \(task_registry=retrieval_tasks\.yaml\) is scored by the evaluation "
                 r"family 'paraphrase_retrieval', which is not registered: pass imports=\[MODULE\] naming the module "
                 r"that registers it \(@register_family\('paraphrase_retrieval'\)\); registered: sts, transfer, "
                 r"clustering$"),
    ("my_sts", "from promptemb.evaluation.families import register_family\nfrom promptemb.evaluation.sts import "
               "STSFamily\n\n\n@register_family('sts')\nclass MySTS(STSFamily):\n    pass\n",
     r"^error: imports=\[my_sts\]: my_sts\.MySTS cannot be registered as the built-in evaluation family 'sts'; "
     r"register it under another name$"),
    ("broken_family", "import numpy\n\nnumpy.no_such_function()\n",
     r"^error: imports=\[broken_family\]: the module failed to import \(an error inside it\): AttributeError: "),
])
def test_refusals_are_one_line_and_leave_nothing(tiny_bert, tmp_path, module, source, pattern):
    data = tmp_path / "data"
    registry = write_retrieval_data(data)
    user = user_directory(tmp_path)
    (user / "retrieval_tasks.yaml").write_text(registry.read_text())
    if module:
        (user / f"{module}.py").write_text(source)
    out = tmp_path / "out"
    proc = evaluate_from(user, *([f"imports=[{module}]"] if module else []), "task_registry=retrieval_tasks.yaml",
                         "tasks=[retrieval]", f"backbone.name_or_path={tiny_bert}", f"output_dir={out}",
                         data_root=data)
    assert_one_line_error(proc, pattern, out)
