"""PromptEOL with an in-context demonstration: the token ids of every official demonstration (kongds/scaling_sentemb
run_icl.sh) on tiny LLaMA and OPT tokenizers equal a re-computation of the official batcher (`_` -> space in the
template only, the demonstration joined with no space after its `".`), the embeddings equal the official ones, the
named template configs are the same templates, and bad input is refused in one line before any forward."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from promptemb.common.errors import ConfigError
from promptemb.configs import CONFIG_DIR
from promptemb.encoder.model import Encoder
from promptemb.encoder.template import Template
from promptemb.poolers import build_pooler
from promptemb.poolers.decoder import PROMPTEOL
from promptemb.poolers.prompteol_icl import DEFAULT_DEMONSTRATION, OFFICIAL_DEMONSTRATIONS
from tests.decoder_helpers import SENTENCES, load_causal_lm, save_tiny_decoder
from tests.decoder_references import scaling_sentemb_batch, scaling_sentemb_reference
from tests.evaluation.test_evaluate_cli import evaluate
from tests.helpers import assert_one_line_error
from tests.poolers.test_decoder_methods import assert_close

#: the test sentences plus one whose `_` must survive (the official code replaces `_` in the template only)
ICL_SENTENCES = [*SENTENCES, "snake_case names keep their under_scores", "Is it 'quoted'?"]


@pytest.fixture(scope="module", params=["llama", "opt"])
def decoder(request, tmp_path_factory):
    directory = save_tiny_decoder(tmp_path_factory.mktemp(f"tiny_{request.param}"), request.param, layers=2,
                                  hidden=32)
    tokenizer, model = load_causal_lm(directory)
    encoder = Encoder(str(directory), device="cpu", batch_size=4, progress=False)
    return request.param, directory, tokenizer, model, encoder


def test_every_official_demonstration_gives_the_official_token_ids(decoder):
    _, _, tokenizer, _, encoder = decoder
    for name, official in OFFICIAL_DEMONSTRATIONS.items():
        builder = encoder.input_builder(build_pooler("prompteol_icl", demonstration=name).input_form())
        ours = [item.input_ids for item in builder.build(ICL_SENTENCES)]
        batch = scaling_sentemb_batch(tokenizer, ICL_SENTENCES, official)
        theirs = [ids[mask.bool()].tolist() for ids, mask in zip(batch["input_ids"], batch["attention_mask"],
                                                                 strict=True)]
        assert ours == theirs, name


def test_the_demonstration_is_joined_without_a_space_and_only_the_template_loses_underscores():
    pooler = build_pooler("prompteol_icl")
    assert DEFAULT_DEMONSTRATION == "opt-6.7b"
    assert pooler.template.text == ('This sentence : "The man is riding a horse." means in one word:"Horseback-riding".'
                                    + PROMPTEOL)
    record = pooler.describe()
    assert record["demonstration"] == "opt-6.7b" and record["template"] == pooler.template.text
    assert record["layer"] == -1 and record["sentence_rule"] == "prompteol"


def test_embeddings_equal_the_official_batcher(decoder):
    _, _, tokenizer, model, encoder = decoder
    for name in (DEFAULT_DEMONSTRATION, "opt-1.3b"):
        actual = encoder.embed(ICL_SENTENCES, [build_pooler("prompteol_icl", demonstration=name)])["prompteol_icl"]
        assert_close(actual, scaling_sentemb_reference(model, tokenizer, ICL_SENTENCES, OFFICIAL_DEMONSTRATIONS[name]))


def test_a_template_in_either_spelling_is_accepted():
    official = OFFICIAL_DEMONSTRATIONS["opt-125m"]
    named = build_pooler("prompteol_icl", demonstration="opt-125m")
    spelled = build_pooler("prompteol_icl", demonstration=official)
    ours = build_pooler("prompteol_icl", demonstration=named.template.text)
    assert named.template == spelled.template == ours.template
    assert spelled.describe()["demonstration"] == "custom"


def test_named_template_configs_are_the_official_demonstrations(decoder):
    files = sorted(Path(CONFIG_DIR, "template").glob("prompteol_icl_*.yaml"))
    assert len(files) == len(OFFICIAL_DEMONSTRATIONS) == 8
    for name in OFFICIAL_DEMONSTRATIONS:
        config = yaml.safe_load(Path(CONFIG_DIR, "template", f"prompteol_icl_{name.replace('-', '_').replace('.', '_')}"
                                     ".yaml").read_text())
        assert config["text"] == build_pooler("prompteol_icl", demonstration=name).template.text
        assert config["sentence_rule"] == "prompteol" and config["second_text"] is None
    # the run's template with `last_token` is the same input as the pooler
    encoder = decoder[-1]
    text = yaml.safe_load((Path(CONFIG_DIR, "template") / "prompteol_icl_opt_6_7b.yaml").read_text())["text"]
    run = encoder.embed(SENTENCES[:3], [build_pooler("last_token")], Template(text), "prompteol")["last_token"]
    own = encoder.embed(SENTENCES[:3], [build_pooler("prompteol_icl")])["prompteol_icl"]
    np.testing.assert_array_equal(run, own)


@pytest.mark.parametrize(("demonstration", "pattern"), [
    ('This sentence : "A man is smoking." means in one word:"Smoking".This sentence : "" means in one word:"',
     r"demonstration template .* has no \[X\] slot for the sentence; write the demonstration, then the prompt"),
    ("opt-7b", r"unknown demonstration 'opt-7b'; valid: opt-125m, opt-350m, opt-1\.3b"),
    ('This sentence : "[X]" means "[X]"', r"has 2 '\[X\]' slots; it needs exactly one"),
    (3, r"demonstration must be a name or a template, got 3"),
])
def test_bad_demonstrations_are_refused_when_built(demonstration, pattern):
    with pytest.raises(ConfigError, match=pattern):
        build_pooler("prompteol_icl", demonstration=demonstration)


@pytest.mark.parametrize(("overrides", "pattern"), [
    (["poolers=[prompteol_icl]",
      "+pooler_args.prompteol_icl.demonstration='This sentence : \"A man.\" means in one word:\"Smoking\".'"],
     r"^error: demonstration template .* has no \[X\] slot"),
    (["poolers=[last_token]", "template=prompteol_icl_opt_6_7b",
      "template.text='This sentence : \"A man.\" means in one word:\"Smoking\".This sentence : \"\" means in one "
      "word:\"'"], r"^error: template .* has 0 '\[X\]' slots"),
])
def test_cli_demonstration_without_a_slot_is_one_line(decoder, real_data_root, overrides, pattern, tmp_path):
    family, directory = decoder[:2]
    if family != "llama":
        pytest.skip("a config refusal: one family is enough")
    out = tmp_path / "out"
    proc = evaluate("backbone=decoder", f"backbone.name_or_path={directory}", *overrides, "tasks=[STSBenchmark]",
                    f"output_dir={out}", data_root=real_data_root)
    assert_one_line_error(proc, pattern, out)
