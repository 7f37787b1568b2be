"""examples/max_pooler.py, a pooler of the user's own module: equal to a plain max over each sentence's token states
computed with transformers alone, and scored by evaluate.py from the user's directory with `imports=[max_pooler]`."""

from __future__ import annotations

import json

from promptemb.data.tasks import get_tasks, load_registry
from promptemb.encoder.model import Encoder
from promptemb.evaluation.sts import evaluate_sts
from promptemb.poolers import build_pooler, build_poolers
from tests.examples.helpers import evaluate_from, example_imported, user_directory
from tests.helpers import assert_close_scaled

SENTENCES = ["a man is playing a guitar .", "the sun is shining", "stocks fell sharply on monday after the report .",
             ""]


def test_max_pooler_is_the_max_over_each_sentences_tokens(tiny_bert, reference):
    """Padded batches of the shared forward against one unpadded forward per sentence: the max over its tokens
    ([CLS] and [SEP] included) of the last layer, and of layer 1 (`max@1`, the pooler's `layer` argument)."""
    _, _, run = reference
    encoder = Encoder(str(tiny_bert), batch_size=3, progress=False)  # batches with padding
    with example_imported("max_pooler"):
        ours = encoder.embed(SENTENCES, build_poolers(["max", "max@1"]))
        assert build_pooler("max").describe() == {"type": "MaxPooler", "layers": [-1], "input": "plain"}
    for row, sentence in enumerate(SENTENCES):
        _, states, _ = run(sentence)
        assert_close_scaled(ours["max"][row], states[-1].max(0), rtol=1e-5, msg=f"last layer, {sentence!r}")
        assert_close_scaled(ours["max@1"][row], states[1].max(0), rtol=1e-5, msg=f"layer 1, {sentence!r}")


def test_max_pooler_equals_sentence_transformers_max_pooling(tiny_bert):
    """The same vectors as sentence-transformers' own `Pooling(pooling_mode="max")` over the same model."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.models import Pooling, Transformer

    transformer = Transformer(str(tiny_bert))
    model = SentenceTransformer(modules=[transformer, Pooling(transformer.get_word_embedding_dimension(), "max")],
                                device="cpu")
    theirs = model.encode(SENTENCES, batch_size=3, convert_to_numpy=True)
    with example_imported("max_pooler"):
        ours = Encoder(str(tiny_bert), batch_size=3, progress=False).embed(SENTENCES, build_poolers(["max"]))["max"]
    for row, sentence in enumerate(SENTENCES):
        assert_close_scaled(ours[row], theirs[row], rtol=1e-5, msg=repr(sentence))


def test_max_pooler_from_the_users_directory(mini_data, tiny_bert, tmp_path):
    """evaluate.py imports=[max_pooler] 'poolers=[max,mean]' run where the user keeps max_pooler.py: both rows, the max
    row (at the layer pooler_args gives) equal to the library's scoring of the same pooler in this process."""
    root, registry = mini_data
    user = user_directory(tmp_path, "max_pooler.py")
    out = tmp_path / "out"
    proc = evaluate_from(user, "imports=[max_pooler]", "poolers=[max,mean]", f"backbone.name_or_path={tiny_bert}",
                         f"task_registry={registry}", "tasks=[MINI12,MINI-B]", f"output_dir={out}",
                         "+pooler_args.max.layer=-2", data_root=root)
    assert proc.returncode == 0, proc.stderr
    results = json.loads((out / "results.json").read_text())
    assert list(results["scores"]) == ["max", "mean"]
    assert results["provenance"]["poolers"]["max"] == {"type": "MaxPooler", "layers": [-2], "input": "plain"}
    tasks = get_tasks(["MINI12", "MINI-B"], load_registry(registry))
    with example_imported("max_pooler"):
        poolers = build_poolers(["max"], {"max": {"layer": -2}})
    expected = evaluate_sts(Encoder(str(tiny_bert), progress=False), tasks, root, poolers)["scores"]["max"]
    assert results["scores"]["max"] == expected
