"""`export.py` / `promptemb-export`: export a trained checkpoint, `promptemb-export ckpt=PATH.ckpt out=DIR [pooler=avg]
[score=true]`.

DIR is both a Hugging Face model directory (AutoModel; template, pooler, layers and denoising in config.json's
`promptemb` block) and a sentence-transformers model (`SentenceTransformer(DIR, trust_remote_code=True)`).
"""

import hydra
from omegaconf import DictConfig

from promptemb.common.errors import exit_on_user_error
from promptemb.configs import CONFIG_DIR
from promptemb.exporting.runner import export_checkpoint


@hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name="export")
@exit_on_user_error
def main(cfg: DictConfig) -> None:
    out = export_checkpoint(cfg.ckpt, cfg.out, pooler=cfg.pooler, denoise=cfg.denoise, overwrite=bool(cfg.overwrite),
                            score=bool(cfg.score), score_tasks=list(cfg.score_tasks), data_root=cfg.data_root,
                            base_model=cfg.base_model)
    print(f"exported to {out}")
