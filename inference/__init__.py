"""Use a trained encoder: `load_encoder(export_dir_or_ckpt).encode(sentences)`, and its MTEB wrapper.

The names are imported on first use (PEP 562), so that `evaluate.py`'s command line, which lives in this package,
answers a mistake without importing the model stack."""

__all__ = ["PromptEncoder", "load_encoder"]


def __getattr__(name: str):
    if name in __all__:
        from promptemb.inference import prompt_encoder

        return getattr(prompt_encoder, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
