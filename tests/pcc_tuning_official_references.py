"""Reference arrays of the official Pcc-tuning stage-two code, made with it in a side environment.

    python3 -m venv /work/pcc-ref
    /work/pcc-ref/bin/pip install torch==2.13.0 transformers==4.37.2 peft==0.6.1 accelerate==0.24.1 \
        datasets==2.16.1 numpy==1.26.1
    git -C MIRROR show 71768f8:code/tune.py > /tmp/pcc_tune.py     # MIRROR: a clone of ZBWpro/Pcc-tuning
    /work/pcc-ref/bin/python tests/pcc_tuning_official_references.py /tmp/pcc_tune.py

writes tests/pcc_tuning_71768f8.json; the tests read it (tests/lightning_modules/test_pcc_tuning.py), never the
official code. code/requirements.txt pins transformers 4.37.2, datasets 2.16.1, numpy 1.26.1, accelerate 0.24.1 and
peft at commit 276c91b (first released in peft 0.6.1, installed here); its torch 2.0.0 is replaced by the project's
CPU torch 2.13.0. Import shim: an empty `bitsandbytes` module (tune.py imports it at the top; only its 4-bit path uses
it) and `Tensor.cuda` returning the tensor itself (compute_loss left-pads the shorter of the anchor and pair blocks
with `torch.zeros(...).cuda()`; the run is on the CPU). Nothing else is changed.

What runs is the official code itself: `get_train_data` (each sentence tokenized without special tokens, cut at
`cutoff_len`, decoded back, the template filled, the prompt tokenized with special tokens), the collator
`DataCollatorForSeq2SeqForNeg` (left padding with id 0 to a multiple of 8), `SentembTrainer.compute_loss` (anchors and
pairs in one forward, attention mask `input_ids > 0`, the last position of the last hidden state, cosine, then
`PearsonCorrelationLoss`) and `loss.backward()`. The model is tune.py's stage-two model: the stage-one LoRA adapter
saved by peft and loaded back with `PeftModel.from_pretrained(..., is_trainable=True)`, as tune.py loads `lora_path`.
Tiny random LLaMA (2 blocks x 32, 4 heads, 2 KV heads), float32, eager attention, train mode with LoRA dropout 0 (so
the gradient is deterministic), LoRA r 4 / alpha 8 on q_proj and v_proj with A and B drawn from a seed (peft starts B
at 0). Base weights, LoRA weights and the tokenizer are rebuilt identically on both sides from this file (per
parameter name from a seeded generator; the tokenizer's JSON is stored), so no weight file is kept.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import sys
import tempfile
import types
from pathlib import Path

import torch

OUT = Path(__file__).with_name("pcc_tuning_71768f8.json")
REPOSITORY_COMMIT = "71768f850d0a760c0a5422b930c10c8d50958824"
SEED = 2024
LORA_R, LORA_ALPHA = 4, 8
TARGETS = ["q_proj", "v_proj"]
#: code/settings.py's three templates (tune.py fills `*sent_0*` after turning `_` into spaces)
TEMPLATES = {"eol": 'This sentence : "*sent_0*" means in one word:"',
             "sum": 'This sentence : "*sent_0*" can be summarized as'}
#: (sentence1, sentence2, gold score): STS-B-like scores, sentences of different lengths (the long ones exceed the
#: small cut-offs below), quotes and a question mark, which training (unlike evaluation) does not rewrite
PAIRS = [
    ("A man is playing a guitar.", "A man plays the guitar.", 4.8),
    ("two dogs run in a field while a plane lands at night", "a plane lands", 1.2),
    ('She said "hello" to the children?', "She greeted the kids.", 3.6),
    ("Stocks fell sharply on Monday", "The sun is shining", 0.0),
    ("the sun is shining", "It is sunny today and the children play in the park near the river", 2.4),
    ("A woman is slicing onions in the kitchen, and a cat watches her from the window sill.",
     "A woman cuts an onion.", 3.0),
    ("Why?", "ok", 0.4),
    ("a cat sleeps", "a cat is sleeping on the sofa", 4.2),
]
#: (template, cutoff_len): the stage-two cut-off of the official settings (64) and one that cuts most sentences
CASES = [("eol", 64), ("eol", 6), ("sum", 8)]


def corpus() -> list[str]:
    words = ("the a man woman dog dogs cat is are playing plays run runs field plane night kitchen window guitar "  # noqa: SIM905
             "onions said hello children kids stocks fell sharply monday sun shining sleeps sofa park river this "
             "sentence means in one word can be summarized as").split()
    lines = [s for pair in PAIRS for s in pair[:2]] + list(TEMPLATES.values())
    lines += [" ".join(words[(i * 7 + j * 3) % len(words)] for j in range(9)) for i in range(80)]
    return lines


def train_tokenizer_json() -> str:
    """A byte-level BPE (vocab 320) with LLaMA's specials (`<unk>`=0, `<s>`=1, `</s>`=2) and `<s>` prepended."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE(unk_token=None))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=320, min_frequency=2, special_tokens=["<unk>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(corpus(), trainer=trainer)
    tokenizer.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    return tokenizer.to_str()


def load_tokenizer(tokenizer_json: str):
    """The fast tokenizer both sides use; no clean-up of spaces on decode (as the LLaMA, Mistral and SmolLM2
    tokenizer configs say), so the official decode of a sentence's ids gives back its text."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(tokenizer_json), bos_token="<s>",
                                   eos_token="</s>", unk_token="<unk>", clean_up_tokenization_spaces=False,
                                   model_input_names=["input_ids", "attention_mask"])


def tiny_config(vocab_size: int):
    from transformers import LlamaConfig

    config = LlamaConfig(vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=False)
    config._attn_implementation = "eager"
    return config


@torch.no_grad()
def seed_weights(model: torch.nn.Module, seed: int = SEED) -> None:
    """Every parameter drawn from one generator in sorted name order: N(0, 0.2²), norms 1 + N(0, 0.1²)."""
    generator = torch.Generator().manual_seed(seed)
    for name, parameter in sorted(model.named_parameters()):
        values = torch.randn(parameter.shape, generator=generator, dtype=torch.float32)
        parameter.copy_(1 + 0.1 * values if name.endswith("norm.weight") else 0.2 * values)


def lora_key(name: str) -> str:
    """A LoRA parameter's name from its block on (`layers.0.self_attn.q_proj.lora_A.default.weight`)."""
    return name[name.index("layers."):]


@torch.no_grad()
def seed_lora(model: torch.nn.Module, seed: int = SEED + 1) -> None:
    """The stage-one adapter: LoRA A and B drawn in sorted key order, N(0, 0.3²)."""
    generator = torch.Generator().manual_seed(seed)
    for _, parameter in sorted((lora_key(n), p) for n, p in model.named_parameters() if "lora_" in n):
        parameter.copy_(0.3 * torch.randn(parameter.shape, generator=generator, dtype=torch.float32))


def f32(tensor: torch.Tensor) -> list | float:
    return [f32(row) for row in tensor] if tensor.dim() else float(f"{float(tensor):.9g}")


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def import_official(path: Path):
    sys.modules.setdefault("bitsandbytes", types.ModuleType("bitsandbytes"))  # imported at the top, 4-bit path only
    torch.Tensor.cuda = lambda self, *args, **kwargs: self  # compute_loss pads with torch.zeros(...).cuda()
    spec = importlib.util.spec_from_file_location("pcc_tune", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def stage_one_adapter(folder: Path, model_dir: Path) -> Path:
    """The stage-one adapter as stage one leaves it (peft's save_pretrained of the trained LoRA)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32, attn_implementation="eager")
    config = LoraConfig(r=LORA_R, lora_alpha=LORA_ALPHA, target_modules=TARGETS, lora_dropout=0.0, bias="none",
                        task_type="CAUSAL_LM")
    model = get_peft_model(base, config)
    seed_lora(model)
    model.save_pretrained(folder)
    return folder


def run_case(tune, tokenizer, model_dir: Path, adapter: Path, template: str, cutoff_len: int) -> dict:
    from datasets import Dataset, DatasetDict
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    # tune.py train(): the tokenizer's pad id and side, the stage-one adapter loaded trainable
    tokenizer.pad_token_id = 0
    tokenizer.padding_side = "left"
    base = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32, attn_implementation="eager")
    model = PeftModel.from_pretrained(base, str(adapter), torch_dtype=torch.float32, is_trainable=True)
    model.config.use_cache = False
    model.train()  # the Trainer's mode; LoRA dropout 0 here, so the gradient is deterministic
    rows = [{"sentence1": a, "sentence2": b, "gold_label": score, "row": i} for i, (a, b, score) in enumerate(PAIRS)]
    data = DatasetDict({"train": Dataset.from_list(rows)})
    train_data = tune.get_train_data(data, tokenizer=tokenizer, mask_embedding_sentence_template=template,
                                     cutoff_len=cutoff_len)
    train_data = train_data.remove_columns(["ssentence1", "ssentence2", "attention_mask", "gold_label"])
    examples = sorted(train_data, key=lambda example: example["row"])  # get_train_data shuffles
    features = [{"input_ids": e["input_ids"], "pair": e["pair"], "label": e["label"]} for e in examples]
    collator = tune.DataCollatorForSeq2SeqForNeg(tokenizer, pad_to_multiple_of=8, return_tensors="pt", padding=True)
    inputs = dict(collator(features))
    trainer = object.__new__(tune.SentembTrainer)  # compute_loss reads these two attributes only
    trainer.is_sts, trainer.llama_avg = True, False
    captured = {}
    cosine = torch.nn.functional.cosine_similarity

    def recording_cosine(x, y, dim=1, **kwargs):
        captured["cos_sim"] = value = cosine(x, y, dim=dim, **kwargs)
        return value

    tune.F.cosine_similarity = recording_cosine
    try:
        loss, pooled = tune.SentembTrainer.compute_loss(trainer, model, inputs, return_outputs=True)
    finally:
        tune.F.cosine_similarity = cosine
    loss.backward()
    grads = {lora_key(name): f32(p.grad) for name, p in sorted(model.named_parameters()) if "lora_" in name}
    # the rows the model saw, padding removed: anchors then pairs
    ids = [row[row > 0].tolist() for row in inputs["input_ids"]]
    return {"template": template, "cutoff_len": cutoff_len, "input_ids": ids,
            "labels": [float(score) for _, _, score in PAIRS], "anchors": f32(pooled[:, 0].detach()),
            "pairs": f32(pooled[:, 1].detach()), "cos_sim": f32(captured["cos_sim"].detach()),
            "loss": f32(loss.detach()), "lora_grads": grads}


def pearson_cases(tune) -> list[dict]:
    """`PearsonCorrelationLoss` alone on seeded inputs: value and gradient with respect to x."""
    cases = []
    for n, seed in ((2, 0), (5, 1), (64, 2)):
        generator = torch.Generator().manual_seed(seed)
        x = torch.randn(n, generator=generator).requires_grad_(True)
        y = torch.rand(n, generator=generator) * 5
        loss = tune.PearsonCorrelationLoss()(x, y)
        loss.backward()
        cases.append({"x": f32(x.detach()), "y": f32(y), "loss": f32(loss.detach()), "grad": f32(x.grad)})
    return cases


def main() -> None:
    import datasets
    import peft
    import transformers
    from transformers import AutoModelForCausalLM

    tune_path = Path(sys.argv[1])
    tune = import_official(tune_path)
    tokenizer_json = train_tokenizer_json()
    tokenizer = load_tokenizer(tokenizer_json)
    record = {"made_by": "tests/pcc_tuning_official_references.py", "repository": "ZBWpro/Pcc-tuning",
              "repository_commit": REPOSITORY_COMMIT, "tune_py_sha256": sha256(tune_path),
              "transformers": transformers.__version__, "peft": peft.__version__, "datasets": datasets.__version__,
              "torch": torch.__version__, "python": sys.version.split()[0], "dtype": "float32", "seed": SEED,
              "lora": {"r": LORA_R, "alpha": LORA_ALPHA, "dropout": 0.0, "target_modules": TARGETS},
              "tokenizer_json": tokenizer_json, "pairs": [list(pair) for pair in PAIRS], "cases": []}
    with tempfile.TemporaryDirectory() as folder:
        model_dir = Path(folder) / "model"
        model = AutoModelForCausalLM.from_config(tiny_config(len(tokenizer)))
        seed_weights(model)
        model.save_pretrained(model_dir)
        tokenizer.save_pretrained(model_dir)
        adapter = stage_one_adapter(Path(folder) / "stage_one", model_dir)
        for name, cutoff_len in CASES:
            record["cases"].append(run_case(tune, load_tokenizer(tokenizer_json), model_dir, adapter,
                                            TEMPLATES[name], cutoff_len))
    record["pearson"] = pearson_cases(tune)
    OUT.write_text(json.dumps(record, separators=(",", ":")) + "\n", encoding="utf-8")
    print(f"wrote {OUT} ({len(record['cases'])} cases)")


if __name__ == "__main__":
    main()
