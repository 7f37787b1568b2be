"""Prompt ensembles: `ck` against a step-by-step re-computation of the official CP code's `ck` on tiny LLaMA and OPT
decoders, the general ensemble (weights, normalisation, a multi-prompt member) against its formula on the members'
own embeddings, one forward per input form, and every bad spelling refused in one line before any forward."""

from __future__ import annotations

import numpy as np
import pytest

from promptemb.common.errors import ConfigError
from promptemb.encoder.model import Encoder
from promptemb.poolers import build_pooler, build_poolers
from promptemb.poolers.decoder import KNOWLEDGE_ENHANCEMENT, PRETENDED_COT
from tests.decoder_helpers import SENTENCES, load_causal_lm, save_tiny_decoder
from tests.decoder_references import CP_CK_PROMPTS, ck_reference
from tests.evaluation.test_evaluate_cli import evaluate
from tests.helpers import assert_close_scaled, assert_one_line_error
from tests.poolers.test_decoder_methods import assert_close

SHORT = SENTENCES[:5]
#: An ensemble recombines its members' float32 embeddings (a mean; unit vectors, whose norms the CPU's kernels sum in
#: their own order): equal to COMBINE_TOL of the largest entry (observed at most 6.2e-8).
COMBINE_TOL = 1e-6


@pytest.fixture(scope="module", params=["llama", "opt"])
def decoder(request, tmp_path_factory):
    """(official tokenizer, official *ForCausalLM, framework Encoder) of a tiny random decoder of the family."""
    directory = save_tiny_decoder(tmp_path_factory.mktemp(f"tiny_{request.param}"), request.param)
    tokenizer, model = load_causal_lm(directory)
    return tokenizer, model, Encoder(str(directory), device="cpu", batch_size=2, progress=False)


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    return save_tiny_decoder(tmp_path_factory.mktemp("tiny_llama_cli"), "llama", layers=2, hidden=32)


def test_the_official_ck_prompts_are_knowledge_enhancement_then_pretended_cot():
    assert [p.replace("*sent 0*", "[X]") for p in CP_CK_PROMPTS] == [KNOWLEDGE_ENHANCEMENT, PRETENDED_COT]
    ck = build_pooler("ck")
    assert [m.template.text for m in ck.members] == [KNOWLEDGE_ENHANCEMENT, PRETENDED_COT]
    assert [m.layer for m in ck.members] == [-1, -1]  # the script's --output_layer default, shared
    assert ck.weights == [1.0, 1.0] and ck.normalize is False


@pytest.mark.parametrize(("name", "layer"), [("ck", -1), ("ck@-2", -2), ("ck@2", 2)])
def test_ck_matches_the_official_ck(decoder, name, layer):
    tokenizer, model, encoder = decoder
    actual = encoder.embed(SHORT, [build_pooler(name)])[name]
    assert_close(actual, ck_reference(model, tokenizer, SHORT, output_layer=layer))


def test_ensembles_share_the_forward_of_their_members_input_forms(decoder):
    _, _, encoder = decoder
    poolers = build_poolers(["pcot", "ke", "pcot+ke", "ck@-2", "ck"])
    encoder.stats.forward_sequences = 0
    out = encoder.embed(SHORT, poolers)
    assert encoder.stats.forward_sequences == 2 * len(SHORT)  # the pcot and ke prompts, every layer from each
    expected = (out["pcot"].astype(np.float64) + out["ke"]) / 2
    assert_close_scaled(out["pcot+ke"], expected, COMBINE_TOL)
    np.testing.assert_array_equal(out["ck@-2"], out["pcot+ke"])  # both members at -2: the same ensemble


def test_weighted_normalised_ensemble_follows_its_formula(decoder):
    _, _, encoder = decoder
    pooler = build_pooler("ensemble", members=["prompteol", "echo@2"], weights=[3, 1], normalize=True)
    out = encoder.embed(SHORT, [pooler, build_pooler("prompteol"), build_pooler("echo@2")])
    unit = [out[n].astype(np.float64) / np.linalg.norm(out[n], axis=1, keepdims=True) for n in ("prompteol", "echo@2")]
    assert_close_scaled(out["ensemble"], (3 * unit[0] + unit[1]) / 4, COMBINE_TOL)
    record = pooler.describe()
    assert record["type"] == "EnsemblePooler" and list(record["members"]) == ["prompteol", "echo@2"]
    assert record["weights"] == [3.0, 1.0] and record["normalize"] is True
    assert record["combine"] == "weighted mean of unit vectors" and record["layers"] == [-1, 2]
    assert record["members"]["echo@2"]["strategy"] == "last"


def test_a_multi_prompt_member_is_its_own_mean_first(decoder):
    _, _, encoder = decoder
    out = encoder.embed(SHORT[:2], [build_pooler("metaeol+prompteol"), build_pooler("metaeol"),
                                    build_pooler("prompteol")])
    expected = (out["metaeol"].astype(np.float64) + out["prompteol"]) / 2
    assert_close_scaled(out["metaeol+prompteol"], expected, COMBINE_TOL)


def test_members_take_the_runs_pooler_args():
    pooler = build_poolers(["prompteol+contrastive_prompting"],
                           {"contrastive_prompting": {"layer": 3, "act_layer": 1}})[0]
    member = pooler.members[1]
    assert member.layer == 3 and member.decoder.contrast.layer == 1
    record = pooler.describe()["members"]["contrastive_prompting"]
    assert record["layer"] == 3 and record["act_layer"] == 1  # the output layer is not overwritten by the hook's


def test_an_encoder_ensemble_runs_on_the_plain_input(tiny_bert):
    encoder = Encoder(str(tiny_bert), device="cpu", progress=False)
    out = encoder.embed(SHORT, build_poolers(["mean", "cls", "mean+cls"]))
    assert_close_scaled(out["mean+cls"], (out["mean"].astype(np.float64) + out["cls"]) / 2, COMBINE_TOL)


@pytest.mark.parametrize(("names", "args", "pattern"), [
    (["pcot+kee"], {}, r"^unknown pooler 'kee' in ensemble 'pcot\+kee'; did you mean ke\? all \d+ are listed in "),
    (["pcot+"], {}, r"^pooler 'pcot\+' is malformed: join member poolers with '\+'"),
    (["ensemble"], {}, r"pooler 'ensemble' needs its member poolers: \+pooler_args\.ensemble\.members=\[pcot,ke\]"),
    (["ensemble"], {"ensemble": {"members": ["pcot", "nope"]}}, r"^unknown pooler 'nope'"),
    (["ensemble"], {"ensemble": {"members": ["pcot"]}}, r"needs at least two member poolers"),
    (["ck+prompteol"], {}, r"member 'ck' is itself an ensemble; list its members instead"),
    (["pcot+pcot"], {}, r"lists a member twice .*give it a larger weight instead"),
    (["pcot+ke"], {"pcot+ke": {"weights": [1]}}, r"weights must be 2 numbers, one per member \(pcot, ke\)"),
    (["pcot+ke"], {"pcot+ke": {"weights": [1, -1]}}, r"weights must be finite, >= 0 and not all 0"),
    (["pcot+ke"], {"pcot+ke": {"normalize": "yes"}}, r"normalize must be true or false"),
    (["pcot+ke"], {"pcot+ke": {"members": ["a", "b"]}}, r"names its members; drop pooler_args\.pcot\+ke\.members"),
    (["ck"], {"ke": {"layer": -2}}, r"pooler 'ck' sets one layer \(-1\) for all its members, and member 'ke' sets"),
    (["pcot@-1+ke"], {"pcot@-1+ke": {"layer": 2}}, r"and member 'pcot@-1' sets its own"),
    (["prompteol+sbert_wk"], {"prompteol+sbert_wk": {"layer": 2}}, r"member .sbert_wk. has no single layer to set"),
    (["idf+mean"], {}, r"member 'idf' is fitted on a corpus"),
    (["pcot+ke"], {"pcot+ke": {"weight": [1, 2]}},
     r"pooler_args\.pcot\+ke\.weight is not an argument of the pooler 'pcot\+ke'; did you mean "
     r"pooler_args\.pcot\+ke\.weights\?"),
    (["pcot+ke"], {"echo": {}}, r"pooler_args given for echo, which is not in poolers=\['pcot\+ke'\] \(nor a member"),
])
def test_bad_ensembles_are_refused_before_any_model(names, args, pattern):
    with pytest.raises(ConfigError, match=pattern):
        build_poolers(names, args)


def test_members_of_different_sizes_are_refused(tiny_bert, monkeypatch):
    encoder = Encoder(str(tiny_bert), device="cpu", progress=False)
    pooler = build_pooler("mean+cls")
    cls = pooler.members[1]
    monkeypatch.setattr(type(cls), "__call__", lambda self, out: out.layer(-1)[:, 0, :5])
    with pytest.raises(ConfigError, match=r"member 'mean\+cls#cls' gives 5-dimensional embeddings, the first member"):
        encoder.embed(SHORT, [pooler])


@pytest.mark.parametrize(("override", "pattern"), [
    ("poolers=[pcot+kee]", r"^error: unknown pooler 'kee' in ensemble 'pcot\+kee'; did you mean ke\? "),
    ("poolers=[ensemble(pcot,ke)]", r"^error: Hydra reads \[ensemble\(pcot,ke\)\] as a function call; join the "
                                    r"members of a pooler ensemble with '\+': poolers=\[pcot\+ke\]"),
])
def test_cli_bad_ensemble_is_one_line(tiny_llama, override, pattern, real_data_root, tmp_path):
    out = tmp_path / "out"
    proc = evaluate("backbone=decoder", f"backbone.name_or_path={tiny_llama}", override, "tasks=[STSBenchmark]",
                    f"output_dir={out}", data_root=real_data_root)
    assert_one_line_error(proc, pattern, out)
