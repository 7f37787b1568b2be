"""Export a trained checkpoint: `python export.py ckpt_path=PATH.ckpt output_dir=DIR [pooler=avg] [score=true]`
(installed: `promptemb-export ...`). The command line lives in exporting/command_line.py."""

from promptemb.exporting.command_line import main

if __name__ == "__main__":
    main()
