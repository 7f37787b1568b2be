import os
import shutil
import tempfile
from pathlib import Path

import pytest

# Inductor's on-disk caches (torch 2.13) do not key a compiled graph by the vector ISA it was built for, and that ISA
# follows ATEN_CPU_CAPABILITY: a kernel compiled in a run held to AVX2 and loaded by a later run at the CPU's own
# AVX-512 (or the reverse) gave wrong values in half the elements or aborted. One cache folder per capability keeps
# the suite's variants (docs/limits.md) from reading each other's kernels; an explicit TORCHINDUCTOR_CACHE_DIR wins.
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(
    tempfile.gettempdir(), f"torchinductor-promptemb-tests-{os.getuid()}",
    os.environ.get("ATEN_CPU_CAPABILITY") or "native"))  # before torch is imported

from promptemb.encoder.model import Encoder
from promptemb.encoder.model_store import models_root
from tests.helpers import reference_runner, save_tiny_bert, save_tiny_mpnet, save_tiny_roberta, write_mini_senteval
from tests.run_faults import WIKI_SAMPLE, fast_overrides, train_py

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")
# downloads and pre-tokenized corpora of this session (subprocesses included) go to a folder removed at exit, never
# to the user's cache
_CACHE = tempfile.TemporaryDirectory(prefix="promptemb-test-cache-")
# ... but models fetched by `promptemb-models` are read where the user keeps them (the slow tests that use them skip
# when they are not fetched; the default suite needs none)
os.environ.setdefault("PROMPTEMB_MODELS", str(models_root()))
os.environ["PROMPTEMB_CACHE"] = _CACHE.name
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def tiny_bert(tmp_path_factory) -> Path:
    return save_tiny_bert(tmp_path_factory.mktemp("tiny_bert"))


@pytest.fixture(scope="module")
def encoder(tiny_bert) -> Encoder:
    """The tiny BERT behind the library's Encoder, one per test module (its forward counters start at 0)."""
    return Encoder(str(tiny_bert), batch_size=2, progress=False)


@pytest.fixture(scope="module")
def reference(tiny_bert):
    """(model, tokenizer, forward) of the tiny BERT in plain transformers: what the poolers are checked against."""
    return reference_runner(tiny_bert)


@pytest.fixture(scope="session")
def tiny_roberta(tmp_path_factory) -> Path:
    return save_tiny_roberta(tmp_path_factory.mktemp("tiny_roberta"))


@pytest.fixture(scope="session")
def tiny_mpnet(tmp_path_factory) -> Path:
    return save_tiny_mpnet(tmp_path_factory.mktemp("tiny_mpnet"))


@pytest.fixture(scope="session")
def tiny_bert_no_mask(tmp_path_factory) -> Path:
    return save_tiny_bert(tmp_path_factory.mktemp("tiny_bert_no_mask"), with_mask_token=False)


@pytest.fixture()
def mini_data(tmp_path) -> tuple[Path, Path]:
    """(data root, registry file) of a mini SentEval tree."""
    registry = write_mini_senteval(tmp_path)
    return tmp_path, registry


@pytest.fixture(scope="session")
def real_data_root() -> Path:
    value = os.environ.get("PROMPTEMB_DATA")
    if not value or not Path(value).is_dir():
        pytest.skip("real SentEval data not available: set PROMPTEMB_DATA (CI sets it to ../shared/data)")
    return Path(value)


@pytest.fixture()
def two_threads():
    """Two torch threads, whatever the machine (restored after): the encoders' "auto" `parallel_batches` then runs
    two batches at once on the CPU."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def tiny_bert_dropout(tmp_path_factory) -> Path:
    """A tiny BERT with dropout on: resumed runs must replay the same dropout masks."""
    return save_tiny_bert(tmp_path_factory.mktemp("tiny_bert_dropout"), dropout=0.1)


@pytest.fixture(scope="session")
def finished_run(tiny_bert, real_data_root, tmp_path_factory) -> dict:
    """A completed 4-step run (checkpoints at steps 2 and 4) on its own copy of a corpus, for tests that resume it,
    refuse it or start over it; tests that change it work on a copy. {"out", "corpus", "overrides"}."""
    base = tmp_path_factory.mktemp("finished_run")
    corpus = base / "corpus.txt"
    shutil.copyfile(real_data_root / WIKI_SAMPLE, corpus)
    out = base / "run"
    overrides = fast_overrides(tiny_bert, real_data_root, out, corpus)
    proc = train_py(*overrides)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {"out": out, "corpus": corpus, "overrides": overrides}
