"""Train a prompt-based sentence encoder: `python train.py experiment=promptbert_unsup [trainer=gpu] [debug=fdr]`
(installed: `promptemb-train ...`). The command line lives in training/command_line.py."""

from promptemb.training.command_line import main

if __name__ == "__main__":
    main()
