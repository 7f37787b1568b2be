"""Score any encoder (or a trained checkpoint, run folder or export) on STS, transfer and clustering, or embed a text
file (installed: `promptemb-evaluate ...`). The command line lives in inference/command_line.py.

    python evaluate.py 'poolers=[mean,mask]' template=promptbert_bert
    python evaluate.py backbone.name_or_path=RUN_DIR_OR_CKPT_OR_EXPORT
    python evaluate.py mode=encode backbone.name_or_path=DIR pooler=mean input=FILE.txt output=FILE.npy
"""

from promptemb.inference.command_line import main

if __name__ == "__main__":
    main()
