"""Token Prepending's `<PST>` input embedding: the model's own `<PST>` row, a vector from a `.npy` file, or a seeded
N(0, 1) draw. The official code adds `<PST>` to the tokenizer and overwrites its row with an unseeded draw on every
run, even when the model already has one; here a model saved with its `<PST>` row, or a published vector, gives
the same embeddings every time, and the source is recorded with every score."""

from __future__ import annotations

import hashlib
import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from promptemb.common.errors import ConfigError
from promptemb.encoder.decoder import PLACEHOLDER, placeholder_embedding
from promptemb.encoder.decoder_forms import PlaceholderVector

#: `auto`: the model's `<PST>` row when its tokenizer has the token, else the seeded draw; `tokenizer`: that row or
#: a refusal; `random`: the seeded draw; anything ending in `.npy`: that file's vector
PLACEHOLDER_SOURCES = ("auto", "tokenizer", "random")


@dataclass(frozen=True, eq=False)
class PlaceholderFile:
    """A `.npy` vector, read and checked when the pooler is built (its size once the model is known)."""

    path: str
    values: np.ndarray
    sha256: str

    @classmethod
    def read(cls, who: str, path: str) -> PlaceholderFile:
        file = Path(path)
        if not file.is_file():
            raise ConfigError(f"pooler {who!r}: placeholder file {path} does not exist; write the <PST> vector with "
                              "numpy.save(path, vector)")
        data = file.read_bytes()
        try:
            values = np.load(io.BytesIO(data), allow_pickle=False)
        except (ValueError, OSError) as err:
            raise ConfigError(f"pooler {who!r}: placeholder file {path} is not a .npy array ({err})") from None
        if not isinstance(values, np.ndarray) or not np.issubdtype(values.dtype, np.floating):
            dtype = getattr(values, "dtype", type(values).__name__)
            raise ConfigError(f"pooler {who!r}: placeholder file {path} holds {dtype} values; it must hold one "
                              "float vector (float16, float32 or float64)")
        if values.ndim != 1:
            raise ConfigError(f"pooler {who!r}: placeholder file {path} has shape {values.shape}; it must hold one "
                              "vector of the model's embedding size, shape (D,): numpy.save(path, vector.reshape(-1))")
        if not np.isfinite(values).all():
            raise ConfigError(f"pooler {who!r}: placeholder file {path} has non-finite values")
        return cls(path, values, hashlib.sha256(data).hexdigest())


def check_placeholder(who: str, placeholder: str) -> PlaceholderFile | None:
    """The option's file (read and checked), or None for `auto` / `tokenizer` / `random`; anything else refused."""
    if placeholder in PLACEHOLDER_SOURCES:
        return None
    if isinstance(placeholder, str) and placeholder.endswith(".npy"):
        return PlaceholderFile.read(who, placeholder)
    raise ConfigError(f"pooler {who!r}: placeholder must be {', '.join(PLACEHOLDER_SOURCES)} or a path to a .npy "
                      f"file, got {placeholder!r}")


def _digest(vector: torch.Tensor) -> str:
    return hashlib.sha256(vector.detach().to(torch.float32).cpu().numpy().tobytes()).hexdigest()


def model_row(who: str, tokenizer, transformer: torch.nn.Module) -> tuple[int, torch.Tensor] | None:
    """(id, input-embedding row) of the tokenizer's `<PST>` token, None when it has none; a token without a row in
    the model's embedding table is refused."""
    token_id = tokenizer.get_vocab().get(PLACEHOLDER)
    if token_id is None:
        return None
    weight = transformer.get_input_embeddings().weight
    if token_id >= weight.shape[0]:
        raise ConfigError(f"pooler {who!r}: the tokenizer has {PLACEHOLDER} (id {token_id}) but the model's input "
                          f"embeddings have {weight.shape[0]} rows; save the model with its {PLACEHOLDER} row "
                          "(resize_token_embeddings), or set placeholder=random or a .npy file")
    return token_id, weight[token_id].detach()


def resolve_placeholder(who: str, placeholder: str, file: PlaceholderFile | None, seed: int, tokenizer,
                        transformer: torch.nn.Module) -> PlaceholderVector:
    """The `<PST>` vector the forward writes, from the source `placeholder` asks for (checked against the model's
    embedding size)."""
    size = int(transformer.get_input_embeddings().weight.shape[1])
    if file is not None:
        if file.values.shape[0] != size:
            raise ConfigError(f"pooler {who!r}: placeholder file {file.path} holds a {file.values.shape[0]}-"
                              f"dimensional vector; the model's input embeddings are {size}-dimensional")
        vector = torch.from_numpy(file.values.astype(np.float64))
        return PlaceholderVector(tuple(vector.tolist()), "file", (("file", file.path), ("file_sha256", file.sha256),
                                                                  ("vector_sha256", _digest(vector))))
    if placeholder in ("auto", "tokenizer"):
        row = model_row(who, tokenizer, transformer)
        if row is not None:
            token_id, vector = row
            values = vector.to(torch.float64).cpu()
            return PlaceholderVector(tuple(values.tolist()), "tokenizer",
                                     (("token_id", token_id), ("vector_sha256", _digest(vector))))
        if placeholder == "tokenizer":
            raise ConfigError(f"pooler {who!r}: placeholder=tokenizer, but the tokenizer has no {PLACEHOLDER} token; "
                              "set placeholder=auto, random or a .npy file")
    vector = placeholder_embedding(seed, size)
    return PlaceholderVector(tuple(vector.to(torch.float64).tolist()), "random",
                             (("seed", seed), ("vector_sha256", _digest(vector))))
