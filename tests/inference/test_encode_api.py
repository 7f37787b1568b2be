"""`PromptEncoder.encode` takes sentence-transformers' arguments and returns what `SentenceTransformer.encode` returns
for them; per-call arguments leave the encoder as it was; `similarity` is ST's cosine similarity."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from promptemb.inference import PromptEncoder, load_encoder
from promptemb.lightning_modules.optiprompt import OptiPrompt
from tests.exporting.test_export import SENTENCES, assert_same_embeddings, export_encoder, sentence_transformer


@pytest.fixture(scope="module")
def exported(tiny_bert, tmp_path_factory) -> Path:
    """An OptiPrompt export (soft template far from the manual one, denoised [MASK])."""
    module = OptiPrompt(str(tiny_bert)).eval()
    with torch.no_grad():
        vectors = module.soft_template.vectors
        vectors.add_(torch.randn(vectors.shape, generator=torch.Generator().manual_seed(0), dtype=vectors.dtype))
    encoder = PromptEncoder(module.transformer, module.tokenizer, template=module.eval_template.text,
                            pooler="mask", denoise=True, soft_template=module.soft_template,
                            max_length=module.max_length)
    return export_encoder(encoder, tmp_path_factory.mktemp("encode") / "export")


@pytest.mark.parametrize("batch_size", [1, 3, 32])
@pytest.mark.parametrize("normalize_embeddings", [False, True])
@pytest.mark.parametrize("convert_to_tensor", [False, True])
def test_encode_matches_sentence_transformers(exported, batch_size, normalize_embeddings, convert_to_tensor):
    ours = load_encoder(exported, device="cpu")
    theirs = sentence_transformer(exported)
    kwargs = {"batch_size": batch_size, "normalize_embeddings": normalize_embeddings,
              "convert_to_tensor": convert_to_tensor}
    got, expected = ours.encode(SENTENCES, **kwargs), theirs.encode(SENTENCES, **kwargs)
    assert type(got) is type(expected)
    assert got.shape == expected.shape == (len(SENTENCES), 32) and got.dtype == expected.dtype
    assert_same_embeddings(np.asarray(got), np.asarray(expected))
    if normalize_embeddings:
        np.testing.assert_allclose(np.linalg.norm(np.asarray(got), axis=1), 1.0, atol=1e-6)
    one, theirs_one = ours.encode(SENTENCES[0], **kwargs), theirs.encode(SENTENCES[0], **kwargs)
    assert one.shape == theirs_one.shape == (32,)
    assert_same_embeddings(np.asarray(one), np.asarray(theirs_one))
    assert ours.encoder.batch_size == 64, "a per-call batch size must not change the encoder"


def test_list_of_tensors_and_similarity(exported):
    ours, theirs = load_encoder(exported, device="cpu"), sentence_transformer(exported)
    rows = ours.encode(SENTENCES[:3], convert_to_numpy=False)
    expected_rows = theirs.encode(SENTENCES[:3], convert_to_numpy=False)
    assert isinstance(rows, list) and len(rows) == len(expected_rows) == 3
    assert all(isinstance(row, torch.Tensor) and row.shape == (32,) for row in rows)
    a, b = ours.encode(SENTENCES[:4]), ours.encode(SENTENCES[4:])
    similarity = ours.similarity(a, b)
    torch.testing.assert_close(similarity, theirs.similarity(a, b), atol=1e-6, rtol=0)
    reference = (a / np.linalg.norm(a, axis=1, keepdims=True)) @ (b / np.linalg.norm(b, axis=1, keepdims=True)).T
    np.testing.assert_allclose(similarity.numpy(), reference, atol=1e-6)
    np.testing.assert_allclose(ours.similarity_pairwise(a, a).numpy(), 1.0, atol=1e-6)
    assert ours.encode([]).shape == (0, 32)


def test_per_call_arguments_leave_the_encoder_as_it_was(exported):
    ours = load_encoder(exported, device="cpu", batch_size=5)
    before = (ours.encoder.batch_size, ours.encoder.progress, ours.device)
    ours.encode(SENTENCES, batch_size=2, show_progress_bar=True, device="cpu")
    assert (ours.encoder.batch_size, ours.encoder.progress, ours.device) == before


def test_device_defaults_to_cuda_when_present(exported, monkeypatch):
    """`device=None` means CUDA where it exists (checked without a GPU: only the choice is tested)."""
    from promptemb.encoder.loading import resolve_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device(None) == torch.device("cuda") == resolve_device("auto")
    assert resolve_device("cpu") == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert load_encoder(exported).device == torch.device("cpu")
