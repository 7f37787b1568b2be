"""promptemb: prompt-based contrastive sentence embeddings (PromptBERT, OptiPrompt, training-free poolers, STS /
transfer / clustering evaluation).

The distribution installs this one top-level package. Its subpackages live in the repository's top-level folders
(`encoder/`, `poolers/`, `data/`, `lightning_modules/`, `configs/`, ...) and are mapped under `promptemb.` by
pyproject.toml's `package-dir`, so the repository keeps its one-concept-per-folder top level while an installed copy
never puts a generic name such as `data` or `common` into site-packages (docs/layout.md).
"""
