"""evaluate.py scores a decoder exactly like an encoder: every decoder method and several layers in one table, each
method's template, layer and paper defaults in the provenance."""

from __future__ import annotations

import json

import pytest

from tests.decoder_helpers import save_tiny_decoder
from tests.evaluation.test_evaluate_cli import evaluate


@pytest.mark.slow  # ~40 s on a shared 2-core CPU (8 methods, one of them 8 prompts)
def test_evaluate_scores_decoder_methods_and_layers_in_one_table(mini_data, tmp_path):
    root, registry = mini_data
    model = save_tiny_decoder(tmp_path / "tiny_llama", "llama", layers=2, hidden=32)
    out = tmp_path / "out"
    names = ["prompteol", "prompteol@1", "pcot", "metaeol", "echo", "token_prepending", "contrastive_prompting",
             "mean", "last_token_plain"]
    proc = evaluate("backbone=decoder", f"backbone.name_or_path={model}", "backbone.device=cpu",
                    f"poolers=[{','.join(names)}]", "+pooler_args.token_prepending.layer=1",
                    "+pooler_args.token_prepending.exit=2", "+pooler_args.contrastive_prompting.layer=1",
                    "+pooler_args.contrastive_prompting.act_layer=0", "tasks=[MINI12,MINI-B]",
                    f"task_registry={registry}", f"output_dir={out}", data_root=root)
    assert proc.returncode == 0, proc.stderr
    results = json.loads((out / "results.json").read_text())
    assert list(results["scores"]) == names
    assert all(set(scores) == {"MINI12", "MINI-B", "avg"} for scores in results["scores"].values())
    prov = results["provenance"]
    assert prov["model"]["decoder"] is True and prov["model"]["padding_side"] == "left"
    assert prov["poolers"]["prompteol"] == {
        "type": "LastTokenPooler", "layers": [-1], "input": "templated", "layer": -1,
        "paper": "Jiang et al. 2023, PromptEOL", "template": 'This sentence : "[X]" means in one word:"',
        "sentence_rule": "prompteol"}
    assert prov["poolers"]["prompteol@1"]["layer"] == 1
    assert prov["poolers"]["pcot"]["layer"] == -2
    assert len(prov["poolers"]["metaeol"]["templates"]) == 8 and prov["poolers"]["metaeol"]["combine"] == "mean"
    assert prov["poolers"]["token_prepending"].items() >= {"method": "token_prepending", "start": 1, "exit": 2,
                                                           "placeholder_seed": 3407, "layer": 1}.items()
    assert prov["poolers"]["contrastive_prompting"]["coeff"] == 0.5
    assert prov["poolers"]["echo"]["echo_template"] == "<s>Document:{!%%text%%}\nDocument again:{%%text%%}{</s>}"
    assert "| prompteol@1 |" in proc.stdout and "| metaeol |" in proc.stdout
    assert prov["poolers"]["last_token_plain"]["input"] == "plain"
    # one record per input form, in the order encoded: its poolers, sentences, tokens and wall seconds
    forms = prov["forward_forms"]
    assert len(forms) == 6 + 8 and sum(len(form["poolers"]) for form in forms) == len(names) - 1 + 8
    assert {"mean", "last_token_plain"} in [set(form["poolers"]) for form in forms]
    assert all(form["sentences"] == prov["unique_sentences"] and form["seconds"] >= 0 for form in forms)


def test_layer_sweep_runs_decoder_methods_from_one_forward_per_form(mini_data, tmp_path):
    """research/layer_sweep on a decoder: PromptEOL and MetaEOL at every layer, each equal to scoring it alone."""
    from promptemb.data.fit_corpora import Corpora
    from promptemb.data.tasks import get_tasks, load_registry
    from promptemb.encoder.model import Encoder
    from promptemb.evaluation.sts import evaluate_sts
    from promptemb.poolers import build_pooler
    from promptemb.research import layer_sweep
    from promptemb.research.task_groups import StsTaskGroup

    root, registry = mini_data
    specs = load_registry(registry)
    group = StsTaskGroup(get_tasks(["MINI-B"], specs), root, Corpora(root, specs))
    model = save_tiny_decoder(tmp_path / "tiny_opt", "opt", layers=2, hidden=32)
    encoder = Encoder(str(model), batch_size=4, progress=False)
    sweep = layer_sweep.run_sweep(encoder, group, ["prompteol", "metaeol"], pairs=False, combos=[])
    unique = evaluate_sts(encoder, group.tasks, group.root, [build_pooler("mean")])["unique_sentences"]
    assert sweep["forward_sequences"] == (1 + 8) * unique  # every layer from one forward per prompt
    assert sorted(sweep["rows"]) == [f"{name}[{layer}]" for name in ("metaeol", "prompteol") for layer in (0, 1, 2)]
    for label, pooler in [("prompteol[1]", build_pooler("prompteol@1")), ("metaeol[0]", build_pooler("metaeol@0"))]:
        alone = evaluate_sts(encoder, group.tasks, group.root, [pooler])["scores"]
        assert sweep["rows"][label]["scores"] == pytest.approx(next(iter(alone.values())), abs=1e-9)
