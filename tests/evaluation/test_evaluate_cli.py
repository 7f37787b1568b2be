"""evaluate.py end to end (subprocess, exactly as users run it): scoring, encoding, and one-line errors."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import yaml

from promptemb.encoder.model import Encoder
from promptemb.poolers import build_pooler
from tests.conftest import REPO
from tests.helpers import assert_close_scaled, assert_one_line_error, sha256

#: evaluate.py mode=encode (its own process and batching) against the library in this process: float32 forwards
#: of one model, equal to ENCODE_TOL of the embeddings' largest entry (the same bits so far, batched alike; a
#: different batching would sum in another order).
ENCODE_TOL = 1e-5
PROMPT = """template.text='This sentence : "[X]" means [MASK] .'"""  # quoted for Hydra, as docs/evaluation.md says


def evaluate(*overrides, data_root=None, env_extra=None):
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    env.pop("PROMPTEMB_DATA", None)
    if data_root is not None:
        env["PROMPTEMB_DATA"] = str(data_root)
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "evaluate.py", "progress=false", *overrides], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)




def test_score_writes_results_with_provenance(mini_data, tiny_bert, tmp_path):
    root, registry = mini_data
    out = tmp_path / "out"
    proc = evaluate(f"backbone.name_or_path={tiny_bert}", "poolers=[mean,mask,avg]", PROMPT,
                    "tasks=[MINI12,MINI-B,MINI-SICK]", f"task_registry={registry}", f"output_dir={out}",
                    data_root=root)
    assert proc.returncode == 0, proc.stderr
    results = json.loads((out / "results.json").read_text())
    assert set(results["scores"]) == {"mean", "mask", "avg"}
    assert set(results["scores"]["mask"]) == {"MINI12", "MINI-B", "MINI-SICK", "avg"}
    prov = results["provenance"]
    assert prov["model"]["name_or_path"] == str(tiny_bert)
    assert prov["input"] == {"template": 'This sentence : "[X]" means [MASK] .', "sentence_rule": "none",
                             "max_sentence_tokens": None}
    assert prov["poolers"]["mask"] == {"type": "MaskPooler", "layers": [-1], "input": "templated", "denoise": False,
                                      "head": None}
    assert prov["seed"] == 42 and "torch" in prov["versions"]
    assert len(prov["tasks"]["MINI12"]["files"]) == 4
    assert all(len(sha) == 64 for sha in prov["tasks"]["MINI-B"]["files"].values())
    assert prov["forward_sequences"] == 2 * prov["unique_sentences"]
    table = (out / "results.md").read_text()
    assert "| mask |" in table and "MINI-B" in table
    assert "| pooler | MINI12 | MINI-B | MINI-SICK | avg |" in proc.stdout
    assert (out / "results.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # Hydra's own files live in the run folder too (never in the current directory)
    assert sorted(p.name for p in out.iterdir()) == [".hydra", "evaluate.log", "results.json", "results.md",
                                                     "results.png"]


def encode_file(tiny_bert, tmp_path, pooler, sentences):
    """Run evaluate.py mode=encode on `sentences`; return (embeddings, provenance record)."""
    (tmp_path / "in.txt").write_text("\n".join(sentences) + "\n")
    out = tmp_path / "emb.npy"
    proc = evaluate("mode=encode", f"backbone.name_or_path={tiny_bert}", f"pooler={pooler}",
                    f"input={tmp_path / 'in.txt'}", f"output={out}")
    assert proc.returncode == 0, proc.stderr
    return np.load(out), json.loads((tmp_path / "emb.npy.json").read_text())


def test_encode_mode_matches_library(tiny_bert, tmp_path):
    sentences = ["a man is playing a guitar .", "the cat sat on the mat .", "hello"]
    embeddings, record = encode_file(tiny_bert, tmp_path, "mean", sentences)
    assert embeddings.shape == (3, 32) and embeddings.dtype == np.float32
    direct = Encoder(str(tiny_bert), progress=False).embed(sentences, [build_pooler("mean")])["mean"]
    assert_close_scaled(embeddings, direct, ENCODE_TOL)
    assert record["rows"] == 3


def test_encode_mode_fits_idf_on_the_input_file(tiny_bert, tmp_path):
    sentences = ["a man is playing a guitar .", "the cat sat on the mat .", "a dog"]
    embeddings, record = encode_file(tiny_bert, tmp_path, "idf", sentences)
    encoder = Encoder(str(tiny_bert), progress=False)
    pooler = build_pooler("idf").fit("T", sentences, encoder.tokenizer)
    assert_close_scaled(embeddings, encoder.embed(sentences, [pooler])["idf"], ENCODE_TOL)
    assert record["provenance"]["poolers"]["idf"]["fit_corpus"] == "T"


def test_encode_empty_input_file(tiny_bert, tmp_path):
    (tmp_path / "empty.txt").write_text("")
    out = tmp_path / "emb.npy"
    proc = evaluate("mode=encode", f"backbone.name_or_path={tiny_bert}", f"input={tmp_path / 'empty.txt'}",
                    f"output={out}")
    assert_one_line_error(proc, r"input file .*empty\.txt is empty")
    assert not out.exists()
    (tmp_path / "blank.txt").write_text("one\n\nthree\n")
    proc = evaluate("mode=encode", f"backbone.name_or_path={tiny_bert}", f"input={tmp_path / 'blank.txt'}",
                    f"output={out}")
    assert_one_line_error(proc, r"blank\.txt:2: empty sentence")
    assert not out.exists()


def test_missing_data_root_says_how_to_set_it(tiny_bert, tmp_path):
    proc = evaluate(f"backbone.name_or_path={tiny_bert}", f"output_dir={tmp_path / 'out'}")
    assert_one_line_error(proc, r"no data root set: pass data_root=PATH or export PROMPTEMB_DATA=PATH",
                          tmp_path / "out")


def test_checksum_mismatch_and_malformed_line(mini_data, tiny_bert, tmp_path):
    root, registry = mini_data
    sick = root / "downstream/SICK/SICK_test_annotated.txt"
    sick.write_text(sick.read_text() + "4\tonly a sentence\n")
    common = (f"backbone.name_or_path={tiny_bert}", f"task_registry={registry}", f"output_dir={tmp_path / 'out'}",
              "tasks=[MINI-SICK]")
    proc = evaluate(*common, data_root=root)
    assert_one_line_error(proc, r"checksum mismatch for .*SICK_test_annotated\.txt", tmp_path / "out")
    # Once the registry accepts the edited file, the reader names the malformed line as file:line.
    records = yaml.safe_load(registry.read_text())
    records["tasks"]["MINI-SICK"]["file"]["sha256"] = sha256(sick)
    registry.write_text(yaml.safe_dump(records))
    proc = evaluate(*common, data_root=root)
    assert_one_line_error(proc, r"SICK_test_annotated\.txt:5: expected at least 4 tab-separated fields",
                          tmp_path / "out")


@pytest.mark.parametrize(
    ("overrides", "pattern"),
    [(["poolers=[mean,nope]"], r"unknown pooler 'nope'; all \d+ are listed in docs/reference\.md"),
     (["tasks=[STS17]"], r"unknown task STS17; valid tasks: STS12, STS13"),
     (["poolers=[mask]", "template.text='This sentence means [MASK] .'"], r"has 0 '\[X\]' slots; it needs exactly one"),
     (["poolers=[mask]", """template.text='This sentence : "[X]" .'"""],
      r"pooler 'mask' needs a \[MASK\] in the template"),
     (["poolers=[avg]"], r"pooler 'avg' pools over a prompt-templated input; pass a template"),
     (["mode=train"], r"mode='train': Input should be 'score'"),
     (["poolers=[token_avg]"], r"needs a named corpus .* pooler_args\.token_avg\.corpus=W")],
)
def test_config_errors(overrides, pattern, tiny_bert, real_data_root, tmp_path):
    proc = evaluate(f"backbone.name_or_path={tiny_bert}", f"output_dir={tmp_path / 'out'}", *overrides,
                    data_root=real_data_root)
    assert_one_line_error(proc, pattern, tmp_path / "out")


def test_mask_pooling_on_model_without_mask_token(tiny_bert_no_mask, real_data_root, tmp_path):
    proc = evaluate(f"backbone.name_or_path={tiny_bert_no_mask}", "poolers=[mask]", PROMPT, "tasks=[STS13]",
                    f"output_dir={tmp_path / 'out'}", data_root=real_data_root)
    assert_one_line_error(proc, r"pooler 'mask' needs a \[MASK\] token but model .* has none", tmp_path / "out")


def test_missing_model_directory(real_data_root, tmp_path):
    proc = evaluate(f"backbone.name_or_path={tmp_path / 'no_model'}", f"output_dir={tmp_path / 'out'}",
                    data_root=real_data_root)
    assert_one_line_error(proc, r"model directory .*no_model does not exist", tmp_path / "out")


def test_weighted_poolers_and_post_processors_from_the_cli(mini_data, tiny_bert, tmp_path):
    root, registry = mini_data
    out = tmp_path / "out"
    proc = evaluate(f"backbone.name_or_path={tiny_bert}", "poolers=[ditto,sbert_wk,idf,remove_biases]",
                    "+pooler_args.ditto.head=1", "+pooler_args.sbert_wk.layer_start=1", "post=[quantile_u,abtt]",
                    "+post_args.abtt.k=1", "analysis=true", "tasks=[MINI12,MINI-B,MINI-SICK]",
                    f"task_registry={registry}", f"output_dir={out}", data_root=root)
    assert proc.returncode == 0, proc.stderr
    results = json.loads((out / "results.json").read_text())
    assert "ditto+quantile_u(T)" in results["scores"] and "idf(T)+abtt(T)" in results["scores"]
    prov = results["provenance"]
    assert prov["fit_corpus"] == "T" and prov["model"]["attention"] == "eager"
    assert prov["poolers"]["ditto"]["attention_head"] == 1 and prov["poolers"]["idf(T)"]["fit_corpus"] == "T"
    assert prov["post_processing"]["sbert_wk+abtt(T)"]["k"] == 1
    assert prov["forward_sequences"] == prov["unique_sentences"]  # one plain form, one forward per sentence
    assert set(results["analysis"]["idf(T)"]["MINI-B"]) >= {"anisotropy", "alignment", "uniformity", "isoscore"}
    assert "| idf(T)+quantile_u(T) |" in (out / "results.md").read_text()


@pytest.mark.parametrize(
    ("overrides", "pattern"),
    [(["poolers=[ditto]", "+pooler_args.ditto.head=4"], r"ditto layer 0 / head 4 is out of range"),
     (["post=[zscore]", "fit_corpus=W"], r"fit corpus 'W': file .*wiki1m_for_simcse\S* does not exist"),
     (["post=[zscore]", "fit_corpus=wiki"], r"unknown fit corpus 'wiki'"),
     (["post=[pca]"], r"unknown post-processor 'pca'; valid: quantile_u, zscore, whiten, abtt, normalize"),
     # a template or sentence rule that no pooler reads would be recorded with the scores and change none of them
     (["poolers=[mean,cls]", "template=promptbert_bert"], r"^error: template\.text is read by none of "
                                                          r"poolers=\[mean,cls\] \(they run on the plain sentence "
                                                          r"or their own template\): add a pooler that reads it"),
     (["poolers=[mean]", "template.sentence_rule=append_period"],
      r"^error: template\.sentence_rule=append_period applies to a templated input and no template is set")],
)
def test_pooler_and_post_errors(overrides, pattern, mini_data, tiny_bert, tmp_path):
    root, registry = mini_data
    proc = evaluate(f"backbone.name_or_path={tiny_bert}", "tasks=[MINI-B]", f"task_registry={registry}",
                    f"output_dir={tmp_path / 'out'}", *overrides, data_root=root)
    assert_one_line_error(proc, pattern, tmp_path / "out")
