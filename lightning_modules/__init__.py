"""LightningModules for PromptBERT (unsupervised / supervised) and OptiPrompt training."""
