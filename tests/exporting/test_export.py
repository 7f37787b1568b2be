"""Export (HF + sentence-transformers directory), the Python encode API and the MTEB wrapper.

Fast tests use tiny random BERTs: checkpoints come from 2-step train.py runs of the three quickstart experiments.
`exporting/st_module.py` re-implements templating and pooling standalone; the agreement tests here keep it in sync
with encoder/ and poolers/.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir

from promptemb.common.errors import ConfigError, DataError
from promptemb.data.tasks import get_tasks
from promptemb.encoder.template import Template
from promptemb.evaluation.scoring_options import ScoringOptions
from promptemb.evaluation.sts import evaluate_sts
from promptemb.exporting.runner import export_checkpoint, write_model_files
from promptemb.exporting.st_layout import choose_layout
from promptemb.inference import PromptEncoder, load_encoder
from promptemb.lightning_modules.checkpoint import load_module_checkpoint
from promptemb.lightning_modules.optiprompt import OptiPrompt
from promptemb.lightning_modules.promptbert import PromptBERTSup, PromptBERTUnsup
from promptemb.training.runner import train
from tests.conftest import REPO
from tests.helpers import MINILM, assert_close_scaled, module_checkpoint
from tests.training.test_train import checked

#: Exported and framework embeddings are float32 forwards of the same weights that batch and pad differently (and so
#: sum in another order, chosen by the CPU's kernels): equal to TOL of the embeddings' largest entry plus TOL of the
#: hidden states' scale (LayerNorm outputs of the tiny models: RMS 1, largest entries ~HIDDEN_SCALE). A denoised
#: embedding h - bias is far smaller than the states it is the difference of and carries their round-off: observed
#: up to 1.4e-6 on embeddings whose largest entry is 0.036 (4e-5 of it), under AVX-512, AVX2 and one thread.
TOL = 1e-5
HIDDEN_SCALE = 3.0


def assert_same_embeddings(got, reference) -> None:
    assert_close_scaled(got, reference, TOL, atol=TOL * HIDDEN_SCALE)

WIKI_SAMPLE = "training/partial/wiki1m_for_simcse.first11914lines.txt"
# lengths 1..~190 tokens (truncated at the room left by the template), a literal [MASK] and template words inside
# the sentence (positions are found by offset, never by token search), quotes and a trailing `?` (sentence rules)
SENTENCES = [
    "a man plays a guitar .",
    "short",
    "This sentence : means [MASK] itself , this sentence of means .",
    "word " * 190,
    'he said "this" means nothing?',
    "two dogs run in a field while a plane lands at night and the sun is shining",
    "x " * 40,
    "A woman is slicing onions",
]


def current_umask() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask


def sentence_transformer(directory: Path):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(directory), trust_remote_code=True, device="cpu")


def framework_embeddings(module, sentences, pooler_index: int = 0) -> np.ndarray:
    """What the training callback scores: the module's evaluation encoder and evaluation pooler."""
    module.eval()
    encoder, pooler = module.evaluation_encoder(batch_size=3), module.eval_poolers()[pooler_index]
    return encoder.embed(sentences, [pooler], module.eval_template, module.hparams.sentence_rule)[pooler.name]


def export_encoder(encoder: PromptEncoder, directory: Path, format: str = "auto") -> Path:
    directory.mkdir()
    write_model_files(encoder, directory, choose_layout(encoder, format))
    return directory


# -- the standalone sentence-transformers module vs the framework ---------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "pooler", "denoise", "max_sentence_tokens", "rule"),
    [("unsup", "mask", False, None, "none"), ("unsup", "mask", True, 5, "promptbert"),
     ("unsup", "avg", False, 7, "append_period"), ("sup", "mask", True, None, "none"),
     ("sup", "avg", False, None, "none"), ("opti", "mask", True, 6, "none"), ("opti", "avg", False, None, "none")],
)
def test_standalone_module_equals_framework(tiny_bert, tmp_path, kind, pooler, denoise, max_sentence_tokens, rule):
    if kind == "unsup":
        module = PromptBERTUnsup(str(tiny_bert), sentence_rule=rule)
    elif kind == "sup":
        module = PromptBERTSup(str(tiny_bert), sentence_rule=rule)
    else:
        module = OptiPrompt(str(tiny_bert), sentence_rule=rule)
        with torch.no_grad():  # trained-looking soft template, far from the manual template's embeddings
            module.soft_template.vectors.add_(torch.randn_like(module.soft_template.vectors))
    module.eval()
    head = getattr(module, "head", None) if pooler == "mask" else None
    encoder = PromptEncoder(module.transformer, module.tokenizer, template=module.eval_template.text,
                            sentence_rule=rule, pooler=pooler, denoise=denoise, head=head,
                            soft_template=getattr(module, "soft_template", None), max_length=module.max_length,
                            max_sentence_tokens=max_sentence_tokens, batch_size=3)
    reference = encoder.encode(SENTENCES)
    directory = export_encoder(encoder, tmp_path / "export")
    for batch_size in (1, 3, 8):  # different padding per batch
        got = sentence_transformer(directory).encode(SENTENCES, batch_size=batch_size, convert_to_numpy=True)
        assert_same_embeddings(got, reference)
    assert_same_embeddings(load_encoder(directory).encode(SENTENCES), reference)
    if max_sentence_tokens is not None:  # truncation really happened and both sides did it the same way
        lengths = sentence_transformer(directory)[0].preprocess(SENTENCES)["sentence_lengths"]
        assert lengths.max().item() == max_sentence_tokens


@pytest.mark.parametrize("denoise", [True, False])
def test_standalone_module_equals_framework_on_roberta(tiny_bert, tmp_path, denoise):
    """RoBERTa-style embeddings count positions from padding_idx + 1: the export's denoising (explicit shifted
    position ids) must use the same base as the framework."""
    from transformers import AutoTokenizer, RobertaConfig, RobertaForMaskedLM

    tokenizer = AutoTokenizer.from_pretrained(tiny_bert)
    config = RobertaConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                           intermediate_size=64, max_position_embeddings=130, pad_token_id=tokenizer.pad_token_id,
                           hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    torch.manual_seed(0)
    RobertaForMaskedLM(config).save_pretrained(tmp_path / "roberta")
    tokenizer.save_pretrained(tmp_path / "roberta")
    module = PromptBERTUnsup(str(tmp_path / "roberta")).eval()
    encoder = PromptEncoder(module.transformer, module.tokenizer, template=module.eval_template.text,
                            pooler="mask", denoise=denoise, max_length=module.max_length, batch_size=3)
    assert encoder.encoder.transformer.embeddings.padding_idx + 1 == 1  # positions start at 1, not 0
    assert module.max_length == encoder.encoder.max_length == 129  # 130 position ids, the first one unused
    reference = encoder.encode(SENTENCES)
    directory = export_encoder(encoder, tmp_path / "export")
    got = sentence_transformer(directory).encode(SENTENCES, batch_size=2, convert_to_numpy=True)
    assert_same_embeddings(got, reference)
    if denoise:  # the bias really is position-dependent here: a base of 0 would give other embeddings
        plain = PromptEncoder(module.transformer, module.tokenizer, template=module.eval_template.text,
                              pooler="mask", denoise=False, max_length=module.max_length).encode(SENTENCES)
        assert np.abs(plain - reference).max() > 1e-3


def test_standalone_module_imports_no_framework_code():
    source = (REPO / "exporting" / "st_module.py").read_text()
    project = {p.name for p in REPO.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    imported = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module.split(".")[0])
    assert not imported & project, f"the exported module imports project packages {imported & project}"
    assert imported <= {"__future__", "hashlib", "json", "os", "torch", "safetensors", "transformers",
                        "sentence_transformers", "peft"}
    top_level = {alias.name for node in ast.parse(source).body if isinstance(node, ast.Import) for alias in node.names}
    assert "peft" not in top_level  # imported only where a kept LoRA adapter is loaded


# -- checkpoints from real (2-step) training runs ----------------------------------------------------------------------


def compose_train(overrides):
    with initialize_config_dir(str(REPO / "configs"), version_base="1.3"):
        return compose("train", overrides=overrides)


@pytest.fixture(scope="module")
def checkpoints(tiny_bert, real_data_root, tmp_path_factory) -> dict[str, Path]:
    """Best checkpoint of a 2-step run of each quickstart experiment on the tiny BERT (unsup: with results.json)."""
    paths = {}
    for name in ("quickstart_unsup", "quickstart_sup", "quickstart_optiprompt"):
        out = tmp_path_factory.mktemp(name)
        cfg = compose_train([f"experiment={name}"])
        overrides = [f"experiment={name}", f"backbone.name_or_path={tiny_bert}", f"data_root={real_data_root}",
                     f"output_dir={out}", "trainer.precision=32-true", "trainer.max_steps=2", "eval_every_n_steps=2",
                     "data.batch_size=4", "data.num_workers=0", "callbacks.sts_evaluation.final_tasks=[STSBenchmark]",
                     f"callbacks.sts_evaluation.score_best_at_end={name == 'quickstart_unsup'}"]
        if name == "quickstart_unsup":  # train.py's export hook: the best checkpoint is exported at the end
            overrides.append(f"export_dir={out / 'export'}")
        if cfg.data._target_.endswith("TextLinesDataModule"):
            overrides += ["data.download=null", f"data.files=[{WIKI_SAMPLE}]", "data.max_examples=64"]
        train(checked(compose_train(overrides)))
        paths[name] = next(p for p in (out / "checkpoints").glob("step*.ckpt"))
    return paths


@pytest.mark.parametrize("name", ["quickstart_unsup", "quickstart_sup", "quickstart_optiprompt"])
def test_export_round_trip(checkpoints, tmp_path, name):
    from transformers import AutoModel

    ckpt = checkpoints[name]
    module = load_module_checkpoint(ckpt).module
    reference = framework_embeddings(module, SENTENCES)
    out = export_checkpoint(ckpt, tmp_path / "export")
    st = sentence_transformer(out).encode(SENTENCES, batch_size=4, convert_to_numpy=True)
    from_dir = load_encoder(out).encode(SENTENCES)
    from_ckpt = load_encoder(ckpt).encode(SENTENCES)
    for got in (st, from_dir, from_ckpt):
        assert_same_embeddings(got, reference)

    record = json.loads((out / "config.json").read_text())["promptemb"]
    assert record["template"] == module.eval_template.text
    assert record["pooler"]["name"] == "mask" and record["pooler"]["layers"] == [-1]
    assert record["pooler"]["denoise"] == (name == "quickstart_sup")  # unsup evaluates without denoising
    assert (record["pooler"]["head"] is not None) == (name == "quickstart_sup")
    assert (record["soft_template"] is not None) == (name == "quickstart_optiprompt")
    assert record["source"]["checkpoint_sha256"] == load_module_checkpoint(ckpt).sha256
    model = AutoModel.from_pretrained(out)  # plain transformers loads it, with the record in its config
    assert model.config.promptemb["template"] == record["template"]
    torch.testing.assert_close(model.get_input_embeddings().weight, module.transformer.get_input_embeddings().weight)
    card = (out / "README.md").read_text()
    assert "trust_remote_code=True" in card and record["template"] in card
    if name == "quickstart_unsup":  # the run's results.json scored this checkpoint: its table is in the card
        results = json.loads((ckpt.parents[1] / "results.json").read_text())
        assert f"{results['scores']['mask']['STSBenchmark']:.2f}" in card
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary directory left
    assert (out.stat().st_mode & 0o777) == 0o777 & ~current_umask()  # not mkdtemp's owner-only mode


def test_train_py_exports_the_best_checkpoint_at_the_end(checkpoints):
    ckpt = checkpoints["quickstart_unsup"]
    out = ckpt.parents[1] / "export"
    record = json.loads((out / "config.json").read_text())["promptemb"]
    assert record["source"]["checkpoint"] == str(ckpt.resolve())
    results = json.loads((ckpt.parents[1] / "results.json").read_text())
    assert f"| mask | {results['scores']['mask']['STSBenchmark']:.2f}" in (out / "README.md").read_text()
    assert_same_embeddings(sentence_transformer(out).encode(SENTENCES, convert_to_numpy=True),
                           load_encoder(ckpt).encode(SENTENCES))


def test_export_avg_pooler_and_scoring(checkpoints, real_data_root, tmp_path):
    ckpt = checkpoints["quickstart_sup"]
    module = load_module_checkpoint(ckpt).module
    out = export_checkpoint(ckpt, tmp_path / "avg", pooler="avg", score=True, data_root=str(real_data_root))
    reference = framework_embeddings(module, SENTENCES, pooler_index=1)
    assert_same_embeddings(sentence_transformer(out).encode(SENTENCES, convert_to_numpy=True), reference)
    record = json.loads((out / "config.json").read_text())["promptemb"]
    assert record["pooler"] == {"name": "avg", "layer": -1, "layers": [-1], "denoise": False, "head": None}
    card = (out / "README.md").read_text()
    module.eval()  # the training callback's scoring path, independent of the exported encoder
    options = ScoringOptions(module.eval_template, module.hparams.sentence_rule)
    scored = evaluate_sts(module.evaluation_encoder(), get_tasks(["STSBenchmark"]), real_data_root,
                          [module.eval_poolers()[1]], options)["scores"]["avg"]["STSBenchmark"]
    assert f"| avg | {scored:.2f} |" in card and "export.py score=true with the exported pooler" in card


def test_card_leaves_out_run_scores_of_another_pooler(checkpoints, tmp_path):
    """denoise=true exports a pooler the run did not score: its results.json table must not be shown as this one's."""
    ckpt = checkpoints["quickstart_unsup"]
    plain = (export_checkpoint(ckpt, tmp_path / "plain") / "README.md").read_text()
    denoised = (export_checkpoint(ckpt, tmp_path / "denoised", denoise=True) / "README.md").read_text()
    assert "the training run's final scoring" in plain
    assert "the training run's final scoring" not in denoised and "No scores recorded" in denoised


def test_existing_out_is_refused_unless_overwrite(checkpoints, tmp_path):
    out = tmp_path / "taken"
    out.mkdir()
    (out / "keep.txt").write_text("x")
    with pytest.raises(ConfigError, match=r"exists and is not empty; pass overwrite=true"):
        export_checkpoint(checkpoints["quickstart_unsup"], out)
    with pytest.raises(ConfigError, match=r"is not a promptemb export .* only replaces an earlier export"):
        export_checkpoint(checkpoints["quickstart_unsup"], out, overwrite=True)  # never deletes a foreign dir
    assert (out / "keep.txt").exists()
    (out / "keep.txt").unlink()
    export_checkpoint(checkpoints["quickstart_unsup"], out)  # into an empty dir
    (out / "keep.txt").write_text("x")
    export_checkpoint(checkpoints["quickstart_unsup"], out, overwrite=True)  # an earlier export is replaced
    assert not (out / "keep.txt").exists() and (out / "modules.json").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken"]


def test_supervised_checkpoint_records_its_recipe_and_holds_no_mlm_model(checkpoints):
    saved = torch.load(checkpoints["quickstart_sup"], weights_only=True)
    assert not [k for k in saved["state_dict"] if k.startswith("mlm_model.")]
    recipe = saved["promptemb_recipe"]
    assert (recipe["name"], recipe["class"]) == ("promptbert_sup",
                                                 "promptemb.lightning_modules.promptbert.PromptBERTSup")
    assert recipe["arguments"]["model_name_or_path"] and "optimizer" not in recipe["arguments"]  # what rebuilds it
    assert {k.split(".")[0] for k in saved["state_dict"]} == {"transformer", "head"}
    assert load_module_checkpoint(checkpoints["quickstart_sup"]).recipe == "promptbert_sup"


# -- bad input ------------------------------------------------------------------------------------------------------


def run_export(*overrides):
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "export.py", *overrides], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)


@pytest.mark.parametrize("case", ["missing", "corrupt", "not_promptemb", "no_args"])
def test_bad_checkpoint_is_one_line_error_and_writes_nothing(tmp_path, case):
    ckpt = tmp_path / "model.ckpt"
    if case == "corrupt":
        ckpt.write_bytes(b"PK\x03\x04 definitely not a zip archive" * 10)
    elif case == "not_promptemb":
        torch.save({"state_dict": {"w": torch.zeros(2)}}, ckpt)
    out = tmp_path / "out"
    proc = run_export(*([] if case == "no_args" else [f"ckpt_path={ckpt}", f"output_dir={out}"]))
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    expected = {"missing": "does not exist", "corrupt": "is corrupt or not a PyTorch checkpoint",
                "not_promptemb": "is not a promptemb training checkpoint",
                "no_args": "export needs ckpt_path=PATH"}[case]
    assert expected in lines[0]
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ([] if case in ("missing", "no_args") else ["model.ckpt"])


def test_api_errors(tmp_path):
    with pytest.raises(ConfigError, match="is not an export directory"):
        load_encoder(tmp_path)
    with pytest.raises(ConfigError, match="does not exist"):
        load_encoder(tmp_path / "nope.ckpt")
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ConfigError, match="no promptemb block"):
        load_encoder(tmp_path)
    with pytest.raises(DataError, match="corrupt"):
        (tmp_path / "x.ckpt").write_text("garbage")
        load_encoder(tmp_path / "x.ckpt")


# -- MTEB -------------------------------------------------------------------------------------------------------------


def test_mteb_wrapper_on_mteb_mock_sts_task(tiny_bert):
    mteb = pytest.importorskip("mteb")
    from mteb.mocks.mock_tasks.sts import MockSTSTask

    from promptemb.evaluation.sts import cosine_rows, spearman_x100
    from promptemb.inference.mteb_wrapper import MTEBEncoder
    from tests.helpers import tiny_mteb_sts_task

    tiny_sts, rows = tiny_mteb_sts_task()
    module = PromptBERTSup(str(tiny_bert)).eval()
    encoder = PromptEncoder.from_module(module)
    wrapper = MTEBEncoder(encoder)
    result = mteb.evaluate(wrapper, [MockSTSTask(), tiny_sts], cache=None, show_progress_bar=False)
    scores = [r.scores["test"][0] for r in result.task_results]
    assert scores[0]["main_score"] == pytest.approx(1.0)  # the mock's own 2 pairs run through
    left, right = encoder.encode([r[0] for r in rows]), encoder.encode([r[1] for r in rows])
    expected = spearman_x100(cosine_rows(left, right), np.array([float(r[2]) for r in rows]))
    assert scores[1]["cosine_spearman"] * 100 == pytest.approx(expected, abs=1e-9)
    # mteb 1.x calling convention: a plain list of sentences
    assert np.abs(wrapper.encode(["a b", "c"]) - encoder.encode(["a b", "c"])).max() == 0


# -- the real model (slow) ------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_minilm_export_round_trip(tmp_path, real_data_root):
    """The real all-MiniLM-L6-v2 weights in a recipe checkpoint, exported and reloaded by sentence-transformers."""
    checkpoint = module_checkpoint(MINILM, tmp_path / "minilm.ckpt")
    module = load_module_checkpoint(checkpoint).module
    sentences = [line.split("\t")[5] for line in (real_data_root / "downstream/STS/STSBenchmark/sts-test.csv")
                 .read_text(encoding="utf-8").splitlines()[:200]]
    reference = framework_embeddings(module, sentences)
    out = export_checkpoint(checkpoint, tmp_path / "minilm")
    assert_same_embeddings(sentence_transformer(out).encode(sentences, convert_to_numpy=True), reference)
    assert_same_embeddings(load_encoder(out).encode(sentences), reference)
    assert Template(json.loads((out / "config.json").read_text())["promptemb"]["template"]).num_masks == 1
