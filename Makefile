# One command to set up and run the main job, one to run the tests; both work on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
PROMPTEMB_DATA ?= $(abspath ../shared/data)
export PROMPTEMB_DATA
export HF_HUB_OFFLINE ?= 1
export WANDB_MODE ?= disabled
BIN := $(VENV)/bin

.PHONY: install quickstart seeds reproduce evaluate test test-slow bench compare image-versions

# PYTHONWARNINGS: setuptools prints an information notice ("Editable installation.") for every editable install of a
# mapped package layout such as ours (docs/layout.md); it is the one thing filtered, so any real packaging warning shows.
$(BIN)/.installed: pyproject.toml .ci/constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	PYTHONWARNINGS="ignore:Editable installation" $(BIN)/pip install -q -c .ci/constraints.txt -e ".[dev]"
	touch $@

install: $(BIN)/.installed

# PromptBERT unsupervised training of all-MiniLM-L6-v2 on the local corpus, STS-B dev curve, then the best
# checkpoint on the 7 STS tasks with [MASK] and avg pooling (a few CPU minutes).
quickstart: install
	$(BIN)/python train.py experiment=quickstart_unsup output_dir=logs/quickstart

# The quickstart with seeds 0, 1 and 2 (one after the other), then one report of every score as mean ± std, min and
# max over the seeds (seed_report.md / .json / .png in the sweep folder logs/quickstart_unsup/multiruns/<time>/).
seeds: install
	$(BIN)/python train.py -m experiment=quickstart_unsup seed=0,1,2

# Re-run every CPU recipe that pins its expected scores (experiment files' `expected_scores`) and fail when a score
# leaves its band; prints expected vs measured.
reproduce: install
	$(BIN)/python -m pytest -m slow tests/research/test_reproduce.py -s

# No training: all-MiniLM-L6-v2 on the 7 STS tasks with mean, [MASK] and avg pooling.
evaluate: install
	$(BIN)/python evaluate.py 'poolers=[mean,mask,avg]' template=promptbert_bert output_dir=logs/evaluate-minilm

test: install
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -n auto --durations=15

test-slow: install
	$(BIN)/python -m pytest -n auto -m slow

bench: install
	$(BIN)/python bench/encode_throughput.py

compare: install
	$(BIN)/python scripts/compare_sentence_transformers.py

# The GPU image's library versions, tested on this CPU; run it before any GPU call. A second venv, .venv-image,
# with the pins of .ci/image-versions.txt (transformers 5.17.0, sentence-transformers 6.0.1, pytorch-lightning
# 2.6.6) and .ci/constraints.txt (the torch 2.13.0 CPU wheel), rebuilt only when a pin or pyproject.toml changes;
# prints the versions, then runs in it the CUDA-profile rehearsal tests, the folded-forward and encoder tests,
# `bench/gpu_validation.py --rehearse` and its encode part shortened; exits 1 when one fails (scripts/image_versions.sh,
# docs/benchmarks.md "Image versions check"; 15-40 minutes on the shared 2-core CPU, by its load).
image-versions:
	bash scripts/image_versions.sh
