"""Options the docs write with Hydra's `+` (new keys under evaluate.py's empty argument maps): without it, one line
giving the spelling that works; with it, they reach the scorer (whiten keeping k of D dimensions)."""

import re

import numpy as np
import pytest

from promptemb.evaluation.pooler_variants import post_processed
from promptemb.postprocessing import build_post
from tests.evaluation.test_evaluate_cli import evaluate
from tests.helpers import assert_one_line_error


@pytest.mark.parametrize(("override", "line"), [
    ("pooler_args.first_last.layers=[0,-1]",
     "error: 'pooler_args.first_last.layers' is a new key (the config's pooler_args is empty): Hydra adds it with "
     "'+': write +pooler_args.first_last.layers=[0,-1]"),
    ("post_args.whiten.k=128",
     "error: 'post_args.whiten.k' is a new key (the config's post_args is empty): Hydra adds it with '+': write "
     "+post_args.whiten.k=128"),
    ("poolerz=[mean]",
     "error: 'poolerz' is not a key of evaluate.py's config; did you mean 'poolers'? prefix it with '+' "
     "(+poolerz=...) only if it is really a new key"),
])
def test_a_new_key_without_plus_is_one_line_with_the_fix(override, line, tmp_path):
    proc = evaluate(override, f"output_dir={tmp_path / 'out'}")
    assert_one_line_error(proc, "^" + re.escape(line) + "$", tmp_path / "out")


def test_whiten_with_k_scores_rows_of_k_dimensions():
    rng = np.random.default_rng(0)
    embeddings = rng.normal(size=(12, 6))
    rows = np.array([1, 3, 5, 7])
    out, fitted = post_processed(embeddings, rows, build_post("whiten", k=2), "T", np.arange(12))
    assert out.shape == (12, 2)
    np.testing.assert_allclose(out[rows], fitted.transform(embeddings[rows]))
    assert not out[[0, 2]].any()


@pytest.mark.slow
def test_whiten_k_from_the_command_line(mini_data, tiny_bert, tmp_path):
    root, registry = mini_data
    out = tmp_path / "out"
    proc = evaluate(f"backbone.name_or_path={tiny_bert}", "tasks=[MINI-B,MINI12]", f"task_registry={registry}",
                    "post=[whiten]", "+post_args.whiten.k=3", f"output_dir={out}", data_root=root)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "| mean+whiten(T) |" in (out / "results.md").read_text()
