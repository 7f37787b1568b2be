# One command to set up and run the main job, one to run the tests; both work on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
PROMPTEMB_DATA ?= $(abspath ../shared/data)
export PROMPTEMB_DATA
export HF_HUB_OFFLINE ?= 1
export WANDB_MODE ?= disabled
BIN := $(VENV)/bin

.PHONY: install lock test-latest quickstart seeds reproduce evaluate test test-slow bench compare image-versions

# The locked install: every distribution of requirements.lock with its hashes, nothing resolved (docs/development.md).
# scripts/lock.py refuses, in one line, a lock compiled from other dependencies than pyproject.toml's.
# PYTHONWARNINGS: setuptools prints an information notice ("Editable installation.") for every editable install of a
# mapped package layout such as ours (docs/layout.md); it is the one thing filtered, so any real packaging warning shows.
$(BIN)/.installed: pyproject.toml requirements.lock
	@$(PYTHON) scripts/lock.py check
	$(PYTHON) -m venv --clear $(VENV)
	$(BIN)/pip install -q --require-hashes --no-deps -r requirements.lock
	PYTHONWARNINGS="ignore:Editable installation" $(BIN)/pip install -q --no-deps --no-build-isolation -e .
	touch $@

install: $(BIN)/.installed

# requirements.lock from pyproject.toml (needs the package index): pip-tools in its own venv, .venv-lock.
lock:
	test -x .venv-lock/bin/pip-compile || { $(PYTHON) -m venv .venv-lock && .venv-lock/bin/pip install -q pip-tools==7.7.0; }
	$(PYTHON) scripts/lock.py compile .venv-lock/bin/pip-compile

# The suite on the newest releases (torch stays the pinned CPU wheel), in its own venv, .venv-latest: what to run
# before `make lock` moves the lock (docs/development.md). Prints the versions it resolved.
test-latest:
	bash scripts/test_latest.sh

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
