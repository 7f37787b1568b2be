"""Reference arrays of the official LLM2Vec code, made with the official package in a side environment.

    python3 -m venv /work/l2v-ref
    /work/l2v-ref/bin/pip install llm2vec==0.2.3 transformers==4.44.2 peft torch==2.13.0
    for script in run_mntp run_simcse run_supervised; do   # the official training scripts
        git -C MIRROR show 312adcf:experiments/$script.py > /tmp/$script.py; done
    /work/l2v-ref/bin/python tests/llm2vec_official_references.py /tmp/run_mntp.py /tmp/run_simcse.py \
        /tmp/run_supervised.py

writes tests/llm2vec_0.2.3.json. llm2vec 0.2.3 (PyPI) pins transformers <= 4.44.2, so it is never installed in the
project's environment; the tests read the file (tests/poolers/test_llm2vec.py). Its `llm2vec.py` and
`models/bidirectional_*.py` are byte-identical to McGill-NLP/llm2vec@312adcfb578b4023bfc9d3bcc83b6b87448ab059 (sha256
recorded). Everything both sides need to rebuild the same inputs lives here without importing either package: the
tokenizer (a byte-level BPE trained on the corpus below, stored as its tokenizer.json), the tiny configs, and the
weights, drawn per parameter name from a seeded generator (`seed_weights`), so transformers 4.44 and 5.x hold the same
tiny models without any weight file in the repository.

Cases: tiny random LLaMA, Mistral, Qwen2 and Gemma (Gemma 1, `GemmaBiModel`) (2 blocks x 32, 4 heads, 2 KV heads,
head_dim 8), float32, CPU, eager attention; `LLM2Vec.encode` with each pooling mode (mean, weighted_mean, eos_token,
last_token), without and with an instruction, batch size 4 over 7 sentences of different lengths (left padding inside
each batch); the causal model (`enable_bidirectional=False`) with mean pooling. The official Qwen2 model is causal on
the CPU (see `QWEN2_NOTE`); the official Gemma model overrides `_update_causal_mask` as LLaMA's and is bidirectional.
Gemma's `eos_token` end text is `"<eos>"`, which the shared tokenizer has no token for (five plain tokens: the
computation is the same either way). Gemma was added by the same command (llm2vec 0.2.3, transformers 4.44.2, torch
2.13.0+cpu); the LLaMA, Mistral and Qwen2 cases, the losses and the MNTP cases came out byte-identical.
MNTP (`mntp`): run_mntp.py's collators, `get_model_class`, `initialize_peft` and the causal-LM loss (`MNTP_CASES`).
The contrastive stages' loss (`losses`): `HardNegativeNLLLoss` at scale 20 (SimCSE) and 50 (supervised).
Added later by the same command (llm2vec 0.2.3, transformers 4.44.2, torch 2.13.0+cpu, peft 0.22.0, accelerate
1.16.0; `training_environment`): the `bos_token` mode's `encode` cases (appended to `cases`), and `training`: the
contrastive stages' training step as run_simcse.py's `SimCSETrainer.compute_loss` (scale 20) and run_supervised.py's
`LLM2VecSupervisedTrainer.compute_loss` (scale 50) run it, each with its own `DefaultCollator` (`TRAINING_MODES`,
`training_cases`). That run reproduced every earlier entry byte for byte but the MNTP LoRA gradients, which came out
within 1.4e-7 of their largest entry (rounding); the file keeps the earlier entries as first recorded and adds the
new ones from that run.
"""

from __future__ import annotations

import hashlib
import json
import sys
import tempfile
from pathlib import Path

import torch

OUT = Path(__file__).with_name("llm2vec_0.2.3.json")
REPOSITORY_COMMIT = "312adcfb578b4023bfc9d3bcc83b6b87448ab059"
SEED = 1234
SENTENCES = [
    "A man is playing a guitar.",
    "two dogs run in a field while a plane lands at night ",
    'She said "hello" to the children?',
    "ok",
    "A woman is slicing onions in the kitchen, and a cat watches her from the window sill.",
    "Stocks fell sharply on Monday",
    "the sun is shining",
]
INSTRUCTION = "Retrieve semantically similar text: "
POOLING_MODES = ("mean", "weighted_mean", "eos_token", "last_token")
FAMILIES = ("llama", "mistral", "qwen2", "gemma")
SPECIALS = ["<unk>", "<s>", "</s>", "<|endoftext|>"]
QWEN2_NOTE = ("llm2vec 0.2.3's Qwen2BiModel keeps Qwen2Model._update_causal_mask (no override) and transformers 4.44's "
              "eager and sdpa Qwen2 attention ignore the module's is_causal (sdpa: is_causal = causal_mask is None "
              "and q_len > 1): under eager and sdpa the official Qwen2 'bidirectional' model is causal; only "
              "flash_attention_2 (the official training configs) reads is_causal=False. Its embeddings here are "
              "the causal model's.")


def corpus() -> list[str]:
    words = ("the a man woman dog cat is are playing runs run field plane night kitchen window guitar onions "  # noqa: SIM905
             "said hello children stocks fell sharply monday sun shining retrieve semantically similar text").split()
    lines = [*SENTENCES, INSTRUCTION]
    lines += [" ".join(words[(i * 7 + j * 3) % len(words)] for j in range(9)) for i in range(60)]
    return lines


def train_tokenizer_json() -> str:
    """A byte-level BPE (vocab 300) with LLaMA's specials and `<s>` prepended, as a tokenizer.json string."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE(unk_token=None))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, min_frequency=2, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(corpus(), trainer=trainer)
    tokenizer.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                             special_tokens=[("<s>", 1)])
    return tokenizer.to_str()


def load_tokenizer(tokenizer_json: str):
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(tokenizer_json), bos_token="<s>",
                                   eos_token="</s>", unk_token="<unk>",
                                   model_input_names=["input_ids", "attention_mask"])


def tiny_config(family: str, vocab_size: int, attn_implementation: str = "eager"):
    from transformers import GemmaConfig, LlamaConfig, MistralConfig, Qwen2Config

    config_class = {"llama": LlamaConfig, "mistral": MistralConfig, "qwen2": Qwen2Config, "gemma": GemmaConfig}[family]
    # Gemma's head_dim defaults to 256 whatever the width: 32 / 4 heads as the others
    extra = {"head_dim": 8, "hidden_act": "gelu_pytorch_tanh"} if family == "gemma" else {}
    config = config_class(vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                          bos_token_id=1, eos_token_id=2, pad_token_id=2, tie_word_embeddings=False, **extra)
    if family == "mistral":
        config.sliding_window = None
    if family == "gemma":
        # transformers 4.44 reads `hidden_activation` (None: gelu_pytorch_tanh with a warning), 5.x `hidden_act`
        config.hidden_activation = "gelu_pytorch_tanh"
    config._attn_implementation = attn_implementation
    return config


@torch.no_grad()
def seed_weights(model: torch.nn.Module, seed: int = SEED) -> None:
    """Every parameter drawn from one generator in sorted name order: N(0, 0.2²), norms 1 + N(0, 0.1²)."""
    generator = torch.Generator().manual_seed(seed)
    for name, parameter in sorted(model.named_parameters()):
        values = torch.randn(parameter.shape, generator=generator, dtype=torch.float32)
        parameter.copy_(1 + 0.1 * values if name.endswith("norm.weight") else 0.2 * values)


def lora_key(name: str) -> str:
    """A LoRA parameter's name from its block on (`layers.0.self_attn.q_proj.lora_A.default.weight`): the same in the
    official wrapping (peft around the inner model of `*BiForMNTP`) and ours (peft around the base model)."""
    return name[name.index("layers."):]


@torch.no_grad()
def seed_lora(model: torch.nn.Module, seed: int = SEED + 1) -> None:
    """LoRA A and B drawn like `seed_weights` (peft starts B at zero, which would leave A without gradient)."""
    generator = torch.Generator().manual_seed(seed)
    lora = sorted((lora_key(name), parameter) for name, parameter in model.named_parameters() if "lora_" in name)
    for _, parameter in lora:
        parameter.copy_(0.2 * torch.randn(parameter.shape, generator=generator, dtype=torch.float32))


#: MNTP cases: (family, data_collator_type, mlm_probability) as the official train_configs/mntp/*.json set them
#: (LLaMA-2, Llama-3, Sheared-LLaMA: default collator, 0.2; Mistral: all_mask, 0.8; none for Gemma or Qwen2, so
#: no case for them); LoRA r 4 (alpha 2r as run_mntp.py), dropout 0 so the gradient is deterministic; mask token "_"
#: (mask_token_type blank)
MNTP_CASES = (("llama", "default", 0.2), ("mistral", "all_mask", 0.8))
MNTP_LORA_R = 4
MNTP_MAX_LENGTH = 64


def mntp_cases(tokenizer_json: str, run_mntp_path: str) -> list[dict]:
    """The official run_mntp.py's collator, model class, `initialize_peft` and loss on the tiny models: the masked
    batch (seeded global RNG, as the Trainer's collator draws it), the loss and every LoRA gradient."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("run_mntp", run_mntp_path)
    run_mntp = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(run_mntp)
    from transformers import DataCollatorForLanguageModeling

    cases = []
    for family, collator_type, probability in MNTP_CASES:
        tokenizer = load_tokenizer(tokenizer_json)
        # run_mntp.main(): mask_token_type "blank" and the pad token
        if tokenizer.mask_token is None:
            tokenizer.mask_token = "_"
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        config = tiny_config(family, len(tokenizer))
        with tempfile.TemporaryDirectory() as folder:
            from transformers import AutoModelForCausalLM

            base = AutoModelForCausalLM.from_config(config)
            seed_weights(base)
            base.save_pretrained(folder)
            model = run_mntp.get_model_class(config).from_pretrained(folder, attn_implementation="eager",
                                                                     torch_dtype=torch.float32)
        model.model = run_mntp.initialize_peft(model.model, lora_r=MNTP_LORA_R, lora_alpha=2 * MNTP_LORA_R,
                                               lora_dropout=0.0)
        seed_lora(model)
        model.train()
        # line_by_line tokenize_function: truncation at max_seq_length, special tokens mask
        features = [tokenizer(s, truncation=True, max_length=MNTP_MAX_LENGTH, return_special_tokens_mask=True)
                    for s in SENTENCES]
        collator_class = {"default": DataCollatorForLanguageModeling,
                          "all_mask": run_mntp.DataCollatorForLanguageModelingWithFullMasking}[collator_type]
        collator = collator_class(tokenizer=tokenizer, mlm_probability=probability)
        torch.manual_seed(SEED)
        batch = collator(features)
        out = model(**batch)
        out.loss.backward()
        grads = {lora_key(name): f32(p.grad) for name, p in sorted(model.named_parameters()) if "lora_" in name}
        cases.append({"family": family, "data_collator_type": collator_type, "mlm_probability": probability,
                      "mask_token": tokenizer.mask_token, "mask_token_id": tokenizer.convert_tokens_to_ids("_"),
                      "padding_side": tokenizer.padding_side, "lora_r": MNTP_LORA_R, "lora_alpha": 2 * MNTP_LORA_R,
                      "input_ids": batch["input_ids"].tolist(), "labels": batch["labels"].tolist(),
                      "attention_mask": batch["attention_mask"].tolist(), "loss": f32(out.loss.detach()),
                      "lora_grads": grads})
    return cases


#: the contrastive training step's cases: the tiny LLaMA, every `get_pooling` mode; LoRA r 4 (alpha 2r, as both
#: scripts), A and B seeded, dropout 0 and attention dropout 0 (run_simcse.py's `simcse_dropout`) so the step is
#: deterministic; `max_seq_length` 128 (no row is cut)
TRAINING_MODES = ("mean", "weighted_mean", "eos_token", "last_token", "bos_token")
TRAINING_LORA_R = 4
TRAINING_MAX_LENGTH = 128
#: E5Data's query format: `f"{instruction}; " + separator + query`; documents `separator + text`
E5_INSTRUCTION = "Retrieve semantically similar text"  # E5_EMBEDDING_PROMPTS["allnli"][1]
E5_SEPARATOR = "!@#$%^&*()"


def training_triplets() -> list[tuple[str, str, str]]:
    """6 (query, positive, hard negative) triplets of the reference sentences."""
    return [(SENTENCES[i], SENTENCES[(i + 1) % len(SENTENCES)], SENTENCES[(i + 3) % len(SENTENCES)])
            for i in range(6)]


def training_cases(tokenizer_json: str, run_simcse_path: str, run_supervised_path: str) -> list[dict]:
    """The official training step of each contrastive stage and pooling mode: the collator's batches (before
    `get_pooling` overwrites their attention mask with the embed mask), the reps `compute_loss` pools, the loss and
    every LoRA gradient."""
    import importlib.util
    import types

    from llm2vec import LLM2Vec
    from llm2vec.dataset.dataset import TrainSample
    from llm2vec.loss.HardNegativeNLLLoss import HardNegativeNLLLoss
    from transformers import AutoModelForCausalLM

    scripts = {}
    for name, path in (("run_simcse", run_simcse_path), ("run_supervised", run_supervised_path)):
        spec = importlib.util.spec_from_file_location(name, path)
        scripts[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(scripts[name])
    stages = (("simcse", scripts["run_simcse"], scripts["run_simcse"].SimCSETrainer, 20.0,
               [TrainSample(texts=[s, s], label=1.0) for s in SENTENCES]),
              ("supervised", scripts["run_supervised"], scripts["run_supervised"].LLM2VecSupervisedTrainer, 50.0,
               [TrainSample(texts=[f"{E5_INSTRUCTION}; " + E5_SEPARATOR + q, E5_SEPARATOR + p, E5_SEPARATOR + n],
                            label=1.0) for q, p, n in training_triplets()]))
    tokenizer = load_tokenizer(tokenizer_json)
    cases = []
    for stage, script, trainer_class, scale, samples in stages:
        for mode in TRAINING_MODES:
            with tempfile.TemporaryDirectory() as folder:
                base = AutoModelForCausalLM.from_config(tiny_config("llama", len(tokenizer)))
                seed_weights(base)
                base.save_pretrained(folder)
                tokenizer.save_pretrained(folder)
                # main(): bidirectional, the pooling mode, max_seq_length, the SimCSE dropout on the config
                model = LLM2Vec.from_pretrained(folder, enable_bidirectional=True, pooling_mode=mode,
                                                max_length=TRAINING_MAX_LENGTH, torch_dtype=torch.float32,
                                                attn_implementation="eager", attention_dropout=0.0)
            model.model = script.initialize_peft(model.model, lora_r=TRAINING_LORA_R, lora_alpha=2 * TRAINING_LORA_R,
                                                 lora_dropout=0.0)
            seed_lora(model.model)
            model.train()
            features, _ = script.DefaultCollator(model)(samples)
            batches = [{key: value.tolist() for key, value in feature.items()} for feature in features]
            reps = []

            def recorded(feature, model=model, reps=reps):
                out = model(feature)
                reps.append(out)
                return out

            trainer = types.SimpleNamespace(model=recorded, loss_function=HardNegativeNLLLoss(scale=scale))
            loss = trainer_class.compute_loss(trainer, model, (features, None))
            loss.backward()
            grads = {lora_key(name): f32(p.grad) for name, p in sorted(model.named_parameters()) if "lora_" in name}
            cases.append({"stage": stage, "scale": scale, "pooling_mode": mode, "family": "llama",
                          "lora_r": TRAINING_LORA_R, "lora_alpha": 2 * TRAINING_LORA_R,
                          "max_length": TRAINING_MAX_LENGTH, "padding_side": model.tokenizer.padding_side,
                          "texts": [sample.texts for sample in samples], "batches": batches,
                          "reps": [f32(rep.detach()) for rep in reps], "loss": f32(loss.detach()),
                          "lora_grads": grads})
    return cases


def loss_cases() -> list[dict]:
    """`llm2vec.loss.HardNegativeNLLLoss` (run_simcse.py: scale 20; run_supervised.py: its default 50) on seeded
    random embeddings: 6 queries, positives, and hard negatives or none; the loss and its gradients."""
    from llm2vec.loss.HardNegativeNLLLoss import HardNegativeNLLLoss

    cases = []
    for scale, negatives in ((20.0, False), (20.0, True), (50.0, True)):
        generator = torch.Generator().manual_seed(int(scale) + negatives)
        tensors = [torch.randn(6, 16, generator=generator).requires_grad_(True) for _ in range(2 + negatives)]
        loss = HardNegativeNLLLoss(scale=scale)(*tensors)
        loss.backward()
        cases.append({"scale": scale, "inputs": [f32(t.detach()) for t in tensors], "loss": f32(loss.detach()),
                      "grads": [f32(t.grad) for t in tensors]})
    return cases


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def f32(tensor: torch.Tensor) -> list:
    return [f32(row) for row in tensor] if tensor.dim() else float(f"{float(tensor):.9g}")


def main() -> None:
    import llm2vec
    import transformers
    from llm2vec import LLM2Vec
    from transformers import AutoModelForCausalLM

    package = Path(llm2vec.__file__).parent
    tokenizer_json = train_tokenizer_json()
    record = {"made_by": "tests/llm2vec_official_references.py", "llm2vec": "0.2.3",
              "repository_commit": REPOSITORY_COMMIT, "transformers": transformers.__version__,
              "torch": torch.__version__, "python": sys.version.split()[0], "dtype": "float32", "seed": SEED,
              "sha256": {name: sha256(package / name) for name in ("llm2vec.py", "models/bidirectional_llama.py",
                                                                     "models/bidirectional_mistral.py",
                                                                     "models/bidirectional_qwen2.py",
                                                                     "models/bidirectional_gemma.py")},
              "tokenizer_json": tokenizer_json, "sentences": SENTENCES, "instruction": INSTRUCTION,
              "qwen2_note": QWEN2_NOTE, "cases": []}
    tokenizer = load_tokenizer(tokenizer_json)
    for family in FAMILIES:
        attention, batch_size = "eager", 4
        with tempfile.TemporaryDirectory() as folder:
            model = AutoModelForCausalLM.from_config(tiny_config(family, len(tokenizer), attention))
            seed_weights(model)
            model.save_pretrained(folder)
            tokenizer.save_pretrained(folder)
            runs = [(mode, instruction, True) for mode in POOLING_MODES for instruction in ("", INSTRUCTION)]
            runs.append(("mean", "", False))
            for mode, instruction, bidirectional in runs:
                encoder = LLM2Vec.from_pretrained(folder, enable_bidirectional=bidirectional, pooling_mode=mode,
                                                  max_length=512, torch_dtype=torch.float32,
                                                  attn_implementation=attention)
                inputs = [[instruction, s] for s in SENTENCES] if instruction else SENTENCES
                embeddings = encoder.encode(inputs, batch_size=batch_size, show_progress_bar=False, device="cpu")
                record["cases"].append({"family": family, "attn_implementation": attention,
                                        "pooling_mode": mode, "instruction": instruction,
                                        "bidirectional": bidirectional, "batch_size": batch_size,
                                        "embeddings": f32(embeddings.float())})
    record["sha256"]["loss/HardNegativeNLLLoss.py"] = sha256(package / "loss/HardNegativeNLLLoss.py")
    record["losses"] = loss_cases()
    if len(sys.argv) > 1:  # the official experiments/run_mntp.py (not part of the package): its MNTP computation
        record["mntp_script_sha256"] = sha256(Path(sys.argv[1]))
        record["mntp"] = mntp_cases(tokenizer_json, sys.argv[1])
    # added after the cases above, which they leave as they were: bos_token, then the contrastive training step
    for family in FAMILIES:
        with tempfile.TemporaryDirectory() as folder:
            model = AutoModelForCausalLM.from_config(tiny_config(family, len(tokenizer), "eager"))
            seed_weights(model)
            model.save_pretrained(folder)
            tokenizer.save_pretrained(folder)
            for instruction in ("", INSTRUCTION):
                encoder = LLM2Vec.from_pretrained(folder, enable_bidirectional=True, pooling_mode="bos_token",
                                                  max_length=512, torch_dtype=torch.float32,
                                                  attn_implementation="eager")
                inputs = [[instruction, s] for s in SENTENCES] if instruction else SENTENCES
                embeddings = encoder.encode(inputs, batch_size=4, show_progress_bar=False, device="cpu")
                record["cases"].append({"family": family, "attn_implementation": "eager",
                                        "pooling_mode": "bos_token", "instruction": instruction,
                                        "bidirectional": True, "batch_size": 4,
                                        "embeddings": f32(embeddings.float())})
    if len(sys.argv) > 3:  # experiments/run_simcse.py and run_supervised.py: their training step
        import accelerate
        import peft

        record["training_scripts_sha256"] = {"run_simcse.py": sha256(Path(sys.argv[2])),
                                             "run_supervised.py": sha256(Path(sys.argv[3]))}
        record["training_environment"] = {"peft": peft.__version__, "accelerate": accelerate.__version__}
        record["training"] = training_cases(tokenizer_json, sys.argv[2], sys.argv[3])
    OUT.write_text(json.dumps(record, separators=(",", ":")) + "\n", encoding="utf-8")
    print(f"wrote {OUT} ({len(record['cases'])} cases)")


if __name__ == "__main__":
    main()
