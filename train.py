"""Train a prompt-based sentence encoder: `python train.py experiment=promptbert_unsup [trainer=gpu] [debug=fdr]`
(installed: `promptemb-train ...`). The command line lives in training/train.py."""

from promptemb.training.train import main

if __name__ == "__main__":
    main()
