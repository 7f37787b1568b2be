"""Use a trained encoder: `load_encoder(export_dir_or_ckpt).encode(sentences)`, and its MTEB wrapper."""

from promptemb.inference.prompt_encoder import PromptEncoder, load_encoder

__all__ = ["PromptEncoder", "load_encoder"]
