"""Tiny randomly initialised decoders (LLaMA, OPT, GPT-2 families) with byte-level BPE tokenizers trained here, saved
as Hugging Face directories, for the decoder prompt-method tests."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from promptemb.poolers.decoder import (
    CONTRASTIVE_AUXILIARY,
    KNOWLEDGE_ENHANCEMENT,
    METAEOL,
    PRETENDED_COT,
    PROMPTEOL,
    TOKEN_PREPENDING_PROMPTEOL,
)

SENTENCES = [
    "A man is playing a guitar.",
    "two dogs run in a field while a plane lands at night",
    'She said "hello" to the children?',
    "Stocks fell sharply on Monday",
    "the sun is shining",
    "A woman is slicing onions in the kitchen, and a cat watches her from the window sill.",
    "Why?",
    "ok",
]

FAMILIES = ("llama", "opt", "gpt2")


def training_corpus() -> list[str]:
    """A few hundred sentences of the local wiki sample (when the data is present), the test sentences and every
    template, so template words are whole tokens as in a real vocabulary."""
    corpus = [*SENTENCES, PROMPTEOL, PRETENDED_COT, KNOWLEDGE_ENHANCEMENT, CONTRASTIVE_AUXILIARY,
              TOKEN_PREPENDING_PROMPTEOL, *METAEOL, "Document again:"]
    root = os.environ.get("PROMPTEMB_DATA")
    wiki = Path(root or "/nonexistent") / "training/partial/wiki1m_for_simcse.first11914lines.txt"
    if wiki.is_file():
        corpus += wiki.read_text(encoding="utf-8").splitlines()[:300]
    return corpus


def train_tokenizer(family: str):
    """A byte-level BPE `PreTrainedTokenizerFast` with the family's special tokens: LLaMA `<unk>=0 <s>=1 </s>=2`
    with `<s>` prepended; OPT `<s>=0 <pad>=1 </s>=2 <unk>=3` with `</s>` prepended (OPT's BOS); GPT-2 a single
    `<|endoftext|>` and nothing added."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    specials = {"llama": ["<unk>", "<s>", "</s>"], "opt": ["<s>", "<pad>", "</s>", "<unk>"],
                "gpt2": ["<|endoftext|>"]}[family]
    tokenizer = Tokenizer(models.BPE(unk_token=None))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=700, min_frequency=2, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(training_corpus(), trainer=trainer)
    if family == "llama":
        tokenizer.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
        kwargs = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<unk>"}
    elif family == "opt":
        tokenizer.post_processor = processors.TemplateProcessing(single="</s> $A", special_tokens=[("</s>", 2)])
        kwargs = {"bos_token": "</s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"}
    else:
        tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
        kwargs = {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>", "unk_token": "<|endoftext|>"}
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, model_max_length=2048,
                                   model_input_names=["input_ids", "attention_mask"], **kwargs)
    assert len(fast) == tokenizer.get_vocab_size() and len(fast) > 300
    return fast


def build_decoder(family: str, vocab_size: int, *, layers: int = 4, hidden: int = 64, seed: int = 0):
    """A randomly initialised *ForCausalLM of the family (float32, eval mode)."""
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, OPTConfig, OPTForCausalLM

    torch.manual_seed(seed)
    if family == "llama":
        config = LlamaConfig(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden,
                             num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                             max_position_embeddings=2048, bos_token_id=1, eos_token_id=2, pad_token_id=0,
                             tie_word_embeddings=False)
        model = LlamaForCausalLM(config)
    elif family == "opt":
        config = OPTConfig(vocab_size=vocab_size, hidden_size=hidden, ffn_dim=2 * hidden, num_hidden_layers=layers,
                           num_attention_heads=4, word_embed_proj_dim=hidden, max_position_embeddings=2048,
                           pad_token_id=1, bos_token_id=2, eos_token_id=2, dropout=0.0, attention_dropout=0.0)
        model = OPTForCausalLM(config)
    else:
        config = GPT2Config(vocab_size=vocab_size, n_embd=hidden, n_layer=layers, n_head=4, n_positions=2048,
                            bos_token_id=0, eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
        model = GPT2LMHeadModel(config)
    return model.eval()


def save_tiny_decoder(directory: Path, family: str, *, layers: int = 4, hidden: int = 64, seed: int = 0) -> Path:
    tokenizer = train_tokenizer(family)
    build_decoder(family, len(tokenizer), layers=layers, hidden=hidden, seed=seed).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def load_causal_lm(directory: Path):
    """(tokenizer, *ForCausalLM) as the official evaluation scripts load them."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoTokenizer.from_pretrained(directory), AutoModelForCausalLM.from_pretrained(directory).eval()


#: mixture-of-experts families MoEE runs on (tests/poolers/test_moee.py)
MOE_FAMILIES = ("olmoe", "qwen2_moe")


def build_moe_decoder(family: str, vocab_size: int, *, layers: int = 3, hidden: int = 64, experts: int = 8,
                      mlp_only_layers: tuple[int, ...] = (), seed: int = 0):
    """A randomly initialised OLMoE or Qwen2-MoE *ForCausalLM (float32, eval mode; 8 experts, top 2, Qwen2-MoE with
    its shared expert). The routers are redrawn with std 0.5 so tokens spread over the experts (transformers draws
    them with the initializer range, 0.02, which routes nearly uniformly)."""
    from transformers import OlmoeConfig, OlmoeForCausalLM, Qwen2MoeConfig, Qwen2MoeForCausalLM

    torch.manual_seed(seed)
    common = dict(vocab_size=vocab_size, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=2048, num_experts=experts, num_experts_per_tok=2,
                  bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=False)
    if family == "olmoe":
        model = OlmoeForCausalLM(OlmoeConfig(intermediate_size=32, **common))
    elif family == "qwen2_moe":
        model = Qwen2MoeForCausalLM(Qwen2MoeConfig(intermediate_size=2 * hidden, moe_intermediate_size=32,
                                                   shared_expert_intermediate_size=48, decoder_sparse_step=1,
                                                   mlp_only_layers=list(mlp_only_layers), **common))
    else:
        raise ValueError(f"unknown MoE family {family!r}; valid: {', '.join(MOE_FAMILIES)}")
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for module in model.modules():
            if type(module).__name__.endswith("TopKRouter"):
                module.weight.copy_(torch.randn(module.weight.shape, generator=generator) * 0.5)
    return model.eval()


def save_tiny_moe_decoder(directory: Path, family: str, **kwargs) -> Path:
    tokenizer = train_tokenizer("llama")
    build_moe_decoder(family, len(tokenizer), **kwargs).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def save_prompteol_adapter(model_dir: Path, path: Path, *, seed: int = 0, **settings) -> Path:
    """A PromptEOLSup checkpoint of `model_dir` as train.py writes it (the adapter only, the base's name and weights
    hash), its LoRA B drawn from `seed` (peft starts it at 0): a stage-one adapter for Pcc-tuning."""
    from promptemb.lightning_modules.prompteol import PromptEOLSup

    module = PromptEOLSup(str(model_dir), **settings)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in sorted(module.named_parameters()):
            if "lora_B" in name:
                parameter.copy_(0.02 * torch.randn(parameter.shape, generator=generator).to(parameter.dtype))
    checkpoint = {"state_dict": module.state_dict(), "hyper_parameters": dict(module.hparams), "global_step": 1}
    module.on_save_checkpoint(checkpoint)
    torch.save(checkpoint, path)
    return path
