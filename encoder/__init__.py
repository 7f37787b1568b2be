"""Prompt-aware encoder: token-level templates, one forward pass per batch, outputs for every pooler."""
