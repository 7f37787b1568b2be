"""Export a trained checkpoint as one directory that is both a Hugging Face model directory (AutoModel, with the
prompt, pooler and provenance in config.json) and a sentence-transformers model (custom module, trust_remote_code)."""
