"""The Hydra config tree, shipped inside the installed package: `CONFIG_DIR` is where train.py, evaluate.py and
export.py (and their console scripts) compose from, in a source checkout and in an installed wheel alike."""

from pathlib import Path

CONFIG_DIR = Path(__file__).resolve().parent
