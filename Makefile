# One command to set up and run the main job, one to run the tests; both work on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
PROMPTEMB_DATA ?= $(abspath ../shared/data)
export PROMPTEMB_DATA
export HF_HUB_OFFLINE ?= 1
export WANDB_MODE ?= disabled
BIN := $(VENV)/bin

.PHONY: install quickstart evaluate test test-slow bench compare

$(BIN)/.installed: pyproject.toml .ci/constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -c .ci/constraints.txt -e ".[dev]"
	touch $@

install: $(BIN)/.installed

# PromptBERT unsupervised training of all-MiniLM-L6-v2 on the local corpus, STS-B dev curve, then the best
# checkpoint on the 7 STS tasks with [MASK] and avg pooling (a few CPU minutes).
quickstart: install
	$(BIN)/python train.py experiment=quickstart_unsup output_dir=logs/quickstart

# No training: all-MiniLM-L6-v2 on the 7 STS tasks with mean, [MASK] and avg pooling.
evaluate: install
	$(BIN)/python evaluate.py 'poolers=[mean,mask,avg]' template=promptbert_bert output_dir=logs/evaluate-minilm

test: install
	$(BIN)/ruff check .
	$(BIN)/python -m pytest

test-slow: install
	$(BIN)/python -m pytest -m slow

bench: install
	$(BIN)/python bench/encode_throughput.py

compare: install
	$(BIN)/python scripts/compare_sentence_transformers.py
