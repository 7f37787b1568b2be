"""Data layer: STS task registry (metadata as data), SentEval-layout readers, checksums, downloads."""
