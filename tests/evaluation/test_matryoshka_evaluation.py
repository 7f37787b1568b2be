"""Matryoshka evaluation: every pooler scored at chosen widths (`pooler@d` rows) from the same forward, equal to
Spearman of the cosine of the truncated embeddings; widths the model cannot give are refused before any forward."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from scipy.stats import spearmanr

from promptemb.common.errors import ConfigError
from promptemb.data.tasks import get_tasks, load_registry
from promptemb.encoder.model import Encoder
from promptemb.encoder.template import Template
from promptemb.evaluation.scoring_options import ScoringOptions
from promptemb.evaluation.session import ScoringSettings
from promptemb.evaluation.sts import evaluate_sts
from promptemb.poolers import build_poolers
from promptemb.postprocessing import build_posts
from tests.evaluation.test_evaluate_cli import PROMPT, evaluate
from tests.helpers import assert_one_line_error

TEMPLATE = Template('This sentence : "[X]" means [MASK] .')


def cosine_spearman(left: np.ndarray, right: np.ndarray, gold: np.ndarray) -> float:
    left = left.astype(np.float64) / np.linalg.norm(left, axis=1, keepdims=True)
    right = right.astype(np.float64) / np.linalg.norm(right, axis=1, keepdims=True)
    return 100 * spearmanr((left * right).sum(1), gold).statistic


def test_rows_at_each_width_are_the_truncated_embeddings_scored(tiny_bert, mini_data):
    root, registry_file = mini_data
    registry = load_registry(registry_file)
    tasks = get_tasks(["MINI12", "MINI-B"], registry)
    encoder = Encoder(str(tiny_bert), progress=False)
    poolers = build_poolers(["mean", "mask"])
    options = ScoringOptions(TEMPLATE, dims=(16, 32, 4), posts=build_posts(["zscore"], {}))
    result = evaluate_sts(encoder, tasks, root, poolers, options)
    forwards = encoder.stats.forward_sequences
    plain = evaluate_sts(encoder, tasks, root, poolers, ScoringOptions(TEMPLATE, posts=build_posts(["zscore"], {})))
    assert encoder.stats.forward_sequences - forwards == forwards  # the widths cost no forward of their own
    # 32 is the full width (the plain row); rows widest first, each raw and post-processed
    assert list(result["scores"]) == ["mean", "mean+zscore(T)", "mean@16", "mean@16+zscore(T)", "mean@4",
                                      "mean@4+zscore(T)", "mask", "mask+zscore(T)", "mask@16", "mask@16+zscore(T)",
                                      "mask@4", "mask@4+zscore(T)"]
    for label in plain["scores"]:
        assert result["scores"][label] == plain["scores"][label]
    pairs = tasks[1].load(root)
    for name, template in (("mean", None), ("mask", TEMPLATE)):
        left, right = (encoder.embed(side, build_poolers([name]), template)[name]
                       for side in (pairs.sentences1, pairs.sentences2))
        for dim in (16, 4):
            expected = cosine_spearman(left[:, :dim], right[:, :dim], pairs.gold_array())
            assert result["scores"][f"{name}@{dim}"]["MINI-B"] == pytest.approx(expected, abs=1e-9)
        assert result["scores"][name]["MINI-B"] == pytest.approx(cosine_spearman(left, right, pairs.gold_array()),
                                                                 abs=1e-9)


def test_a_width_beyond_the_model_is_refused_before_any_forward(tiny_bert, mini_data):
    root, registry_file = mini_data
    encoder = Encoder(str(tiny_bert), progress=False)
    with pytest.raises(ConfigError, match=re.escape("dims=[64, 8]: 64 is wider than the model's 32-dimensional "
                                                    "embeddings; use widths <= 32")):
        evaluate_sts(encoder, get_tasks(["MINI-B"], load_registry(registry_file)), root, build_poolers(["mean"]),
                     ScoringOptions(dims=(64, 8)))
    assert encoder.stats.forward_sequences == 0


@pytest.mark.parametrize(("dims", "message"), [((0,), "dims=[0]: every width must be an integer >= 1"),
                                               ((8, 8), "dims=[8, 8] lists a width twice")])
def test_scoring_settings_refuse_bad_widths(dims, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        ScoringSettings(poolers=["mean"], dims=dims)


def test_evaluate_cli_scores_widths_and_refuses_a_wider_one(mini_data, tiny_bert, tmp_path):
    root, registry = mini_data
    common = [f"backbone.name_or_path={tiny_bert}", "poolers=[mean,mask]", PROMPT, "tasks=[MINI12,MINI-B]",
              f"task_registry={registry}"]
    out = tmp_path / "out"
    proc = evaluate(*common, "dims=[32,16,8]", f"output_dir={out}", data_root=root)
    assert proc.returncode == 0, proc.stderr
    results = json.loads((out / "results.json").read_text())
    assert list(results["scores"]) == ["mean", "mean@16", "mean@8", "mask", "mask@16", "mask@8"]
    assert results["provenance"]["dims"] == [32, 16, 8]
    assert "| mask@8 |" in (out / "results.md").read_text()
    refused = tmp_path / "refused"
    assert_one_line_error(evaluate(*common, "dims=[64]", f"output_dir={refused}", data_root=root),
                          re.escape("dims=[64]: 64 is wider than the model's 32-dimensional embeddings"), refused,
                          status=2)


def test_dims_in_encode_mode_is_refused_as_a_key_of_the_score_command(tmp_path):
    from promptemb.inference.command_line import check_evaluate_command

    with pytest.raises(ConfigError, match=r"^'dims' is not a key of promptemb-encode's config"):
        check_evaluate_command(["mode=encode", "dims=[8]", f"output_dir={tmp_path / 'out'}"], "encode",
                               composition_only=True)
    assert not list(tmp_path.iterdir())
