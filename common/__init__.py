"""Small shared utilities: the user-facing error type, atomic file writes, provenance helpers."""
