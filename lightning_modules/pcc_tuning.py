"""Pcc-tuning's second stage (Zhang & Li, EMNLP 2024, "Pcc-tuning: Breaking the Contrastive Learning Ceiling in
Semantic Textual Similarity"; official code ZBWpro/Pcc-tuning@71768f8 code/tune.py): the PromptEOL LoRA adapter of
stage one (`PromptEOLSup`, contrastive on NLI) trained further on sentence pairs with graded gold scores (the official
data merges the STS-B and SICK-R train splits: `data=sts_sick_pairs`), with a Pearson correlation loss.

A batch of n scored pairs is embedded in ONE forward of its 2n prompts (the n first sentences, then the n second
ones, as compute_loss concatenates them), each the last token's state after the final norm (the `LastTokenPooler`
evaluate.py scores with); the loss is 1 − ρ between the n cosines and the n gold scores (`pearson.py`), over the
global batch under DDP (the official trainer all-gathers the embeddings and scores too).

What tune.py does, reproduced here:

* the stage-one adapter is loaded trainable (`PeftModel.from_pretrained(..., is_trainable=True)`) and trained
  further with a fresh optimiser: its LoRA settings (r, alpha, dropout, target modules) are stage one's;
* training prompts: each sentence cut to its first `max_sentence_tokens` tokens (the official `cutoff_len`, 64), no
  sentence rule (`train_sentence_rule=none`: no period appended, no quote rewritten, unlike the evaluation's
  `prompteol` rule), the template filled and tokenized whole with the tokenizer's special tokens;
* `pearson=pcc_tuning`: its covariance over n and unbiased variances, i.e. ρ = r·(n−1)/n (`pearson=exact`: r);
* AdamW at 5e-4, 100 warm-up steps then linear decay, gradients clipped at 1.0 (the Hugging Face Trainer's
  defaults), batches of about 216 pairs (54 per GPU on 4 GPUs), 8-10 epochs, a checkpoint every 25 steps.

Differences that do not change the computation: tune.py decodes each cut sentence back to text (the same text for
the byte-level and SentencePiece tokenizers whose configs do not clean up spaces: LLaMA, Mistral, SmolLM2), masks
attention with `input_ids > 0` (id 0 is padding, never a token of a prompt for these tokenizers), and counts
positions through the left padding (RoPE attends by relative position: the same attention up to round-off; here
positions come from the attention mask). The loader drops the last incomplete batch (the official one trains it).

A checkpoint holds the whole adapter (stage one's, trained further) with the base model's name and weights' sha256,
so it is rebuilt on the base alone; the stage-one checkpoint's path and sha256 stay in its adapter record.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch
import torch.nn.functional as F

from promptemb.common.bounds import AtLeastOne, Fraction, TokenLimit
from promptemb.common.errors import ConfigError, DataError
from promptemb.data.checksums import sha256_file
from promptemb.data.datamodules import local_corpus_path
from promptemb.data.scored_pairs import SCORE_RANGES, file_formats, scores_of
from promptemb.encoder.decoder import DecoderInputBuilder, PaddingSide
from promptemb.encoder.inputs import InputForm
from promptemb.encoder.loading import DType
from promptemb.encoder.template import SentenceRule
from promptemb.lightning_modules.checkpoint import read_checkpoint
from promptemb.lightning_modules.losses import gather_with_grad
from promptemb.lightning_modules.pearson import PEARSON_VARIANTS, PearsonVariant, pearson_loss
from promptemb.lightning_modules.prompteol import ADAPTER_RECORD, PromptEOLSup
from promptemb.lightning_modules.recipe import RECORD_KEY, register_recipe
from promptemb.poolers.decoder import PROMPTEOL

#: PromptEOL's LoRA settings, for a run without a stage-one adapter (the paper's "Pcc-tuning alone")
LORA_DEFAULTS = {"lora_r": 64, "lora_alpha": 16, "lora_dropout": 0.05, "lora_target_modules": ["q_proj", "v_proj"]}
#: the registered recipes whose checkpoints' adapter stage two continues: PromptEOL's last-token recipes
STAGE_ONE_RECIPES = ("prompteol_sup", "pcc_tuning")
SCORED_DATA = "data=sts_sick_pairs, data=stsb_pairs or data=sickr_pairs"


def read_stage_one(path: str) -> dict:
    """A stage-one checkpoint (its header, memory-mapped): one line when it is not a PromptEOL adapter."""
    checkpoint = read_checkpoint(path, argument="model.stage_one_adapter")
    recipe = checkpoint.get(RECORD_KEY) if isinstance(checkpoint.get(RECORD_KEY), dict) else {}
    record = checkpoint.get(ADAPTER_RECORD)
    if recipe.get("name") not in STAGE_ONE_RECIPES or not isinstance(record, dict):
        name = str(recipe.get("class") or "no recipe").rsplit(".", 1)[-1]
        raise DataError(f"model.stage_one_adapter={path} is a checkpoint of {name}; Pcc-tuning continues a PromptEOL "
                        "LoRA adapter: pass a checkpoint of experiment=prompteol_sup "
                        "(e.g. quickstart_prompteol_sup_smollm2's checkpoints/last.ckpt)")
    return checkpoint


def stage_one_settings(settings: dict, checkpoint: dict) -> dict[str, object]:
    """The LoRA settings stage two trains with: stage one's (a different value set here is refused in one line, as
    tune.py trains the loaded adapter as it is); its dtype and quantization must be this run's, since the base
    weights' hash covers them."""
    recorded = checkpoint["hyper_parameters"]
    lora = {}
    for key, default in LORA_DEFAULTS.items():
        value, theirs = settings.get(key), recorded.get(key, default)
        if isinstance(theirs, list | tuple):
            value, theirs = (None if value is None else list(value)), list(theirs)
        if value is not None and value != theirs:
            raise ConfigError(f"model.{key}={value} but the stage-one adapter has {key}={theirs}; Pcc-tuning trains "
                              f"that adapter further, with its own settings: drop model.{key}")
        lora[key] = theirs
    for key, default in (("dtype", "float32"), ("quantization", None)):
        value, theirs = settings.get(key, default), recorded.get(key, default)
        if value != theirs:
            raise ConfigError(f"model.{key}={value} but stage one loaded its base with {key}={theirs} (the adapter "
                              f"belongs to those base weights): set model.{key}={theirs}")
    return lora


@register_recipe("pcc_tuning")
class PccTuning(PromptEOLSup):
    """Pcc-tuning's second stage on a PromptEOL LoRA adapter (see the module docstring). `stage_one_adapter`: a
    checkpoint of PromptEOLSup (null: a fresh LoRA with `lora_*` or PromptEOL's defaults); `lora_*` null: stage
    one's. `sentence_rule` is the evaluation's (scoring, exports), `train_sentence_rule` the training prompts'."""

    @classmethod
    def check_config(cls, settings: dict) -> None:
        """Before anything loads: the Pearson variant, and the stage-one checkpoint with the settings it fixes."""
        super().check_config(settings)
        if "model_name_or_path" not in settings:  # PromptEOLSup's partial check of its Matryoshka settings
            return
        if settings.get("pearson", "pcc_tuning") not in PEARSON_VARIANTS:
            raise ConfigError(f"model.pearson={settings['pearson']!r}; valid: {', '.join(PEARSON_VARIANTS)}")
        if settings.get("stage_one_adapter"):
            stage_one_settings(settings, read_stage_one(settings["stage_one_adapter"]))

    @classmethod
    def check_training_data(cls, data: dict, root: Path) -> None:
        """Before anything loads: the data gives pairs with gold scores, and the scores are not all equal (Pearson's
        correlation with constant scores is undefined)."""
        formats = data.get("format")
        given = [formats] if isinstance(formats, str) else list(formats or [])
        if not given or any(fmt not in SCORE_RANGES for fmt in given):
            what = "single sentences" if not given else f"data.format={formats}, examples without a score column"
            raise ConfigError(f"Pcc-tuning trains on sentence pairs with gold similarity scores ({SCORED_DATA}); "
                              f"the data config gives {what}")
        scores = [score for name, fmt in file_formats(data.get("file"), formats)
                  for score in scores_of(local_corpus_path(name, data.get("data_root") or str(root)), fmt)]
        if scores and min(scores) == max(scores):
            raise DataError(f"every training pair scores {scores[0]:g} (data.file={data.get('file')}): Pearson's "
                            "correlation is undefined for constant gold scores; train on pairs with graded scores")

    def __init__(
        self,
        model_name_or_path: str,
        stage_one_adapter: str | None = None,
        pearson: PearsonVariant = "pcc_tuning",
        templates: list[str] = (PROMPTEOL,),
        eval_template: str | None = None,
        optimizer=None,
        scheduler=None,
        max_sentence_tokens: AtLeastOne = 64,
        sentence_rule: SentenceRule = "prompteol",
        train_sentence_rule: SentenceRule = "none",
        max_length: TokenLimit | None = None,
        lora_r: AtLeastOne | None = None,
        lora_alpha: AtLeastOne | None = None,
        lora_dropout: Fraction | None = None,
        lora_target_modules: list[str] | None = None,
        quantization: str | None = None,
        dtype: DType = "float32",
        padding_side: PaddingSide = "left",
        grad_cache_chunk_size: AtLeastOne | None = None,
        gradient_checkpointing: bool = False,
        base_weights_sha256: str | None = None,
    ):
        arguments = {k: v for k, v in locals().items() if k not in ("self", "optimizer", "scheduler",
                                                                      "base_weights_sha256", "__class__")}
        type(self).check_config(arguments)
        stage_one = read_stage_one(stage_one_adapter) if stage_one_adapter else None
        if stage_one is not None:
            lora = stage_one_settings(arguments, stage_one)
        else:
            lora = {key: list(value) if isinstance(value, list | tuple) else value for key, default in
                    LORA_DEFAULTS.items() for value in [default if arguments[key] is None else arguments[key]]}
        super().__init__(model_name_or_path, templates=list(templates), eval_template=eval_template,
                         optimizer=optimizer, scheduler=scheduler, max_sentence_tokens=max_sentence_tokens,
                         sentence_rule=sentence_rule, max_length=max_length, quantization=quantization, dtype=dtype,
                         padding_side=padding_side, grad_cache_chunk_size=grad_cache_chunk_size,
                         gradient_checkpointing=gradient_checkpointing, base_weights_sha256=base_weights_sha256,
                         **lora)
        # this recipe's own hyper-parameters, the LoRA ones resolved (PromptEOLSup recorded InfoNCE's too, which
        # save_hyperparameters would keep beside them)
        arguments.update(lora, templates=list(templates),
                         stage_one_adapter=str(Path(stage_one_adapter).resolve()) if stage_one_adapter else None)
        for key in set(self.hparams) - set(arguments):
            self.hparams.pop(key)
        self.save_hyperparameters(arguments)
        # training prompts as tune.py builds them (the evaluation keeps `sentence_rule`)
        self.builders = [DecoderInputBuilder(self.tokenizer, InputForm(self.templates[0], train_sentence_rule,
                                                                       max_sentence_tokens),
                                             self.max_length, padding_side)]
        self.stage_one = None
        if stage_one is not None:
            self._load_stage_one(Path(stage_one_adapter), stage_one)
        self.step_scores: torch.Tensor | None = None  # the gold scores of the step's batch (`contrastive_loss`)

    def _load_stage_one(self, path: Path, checkpoint: dict) -> None:
        record = checkpoint[ADAPTER_RECORD]
        if record.get("base_weights_sha256") != self.base_weights_sha256:
            raise DataError(f"model.stage_one_adapter={path} was trained on base weights sha256 "
                            f"{str(record.get('base_weights_sha256'))[:12]}… ({record.get('base_model')}), but "
                            f"{self.hparams.model_name_or_path!r} has {self.base_weights_sha256[:12]}…; set "
                            "backbone.name_or_path to the model stage one trained")
        try:
            PromptEOLSup.load_state_dict(self, checkpoint["state_dict"])
        except RuntimeError as err:
            raise DataError(f"model.stage_one_adapter={path}: {str(err).splitlines()[0]}") from None
        self.transformer.train()
        self.stage_one = {"path": str(path.resolve()), "sha256": sha256_file(path, cached=False)}

    # -- the step -------------------------------------------------------------------------------------------------

    def contrastive_loss(self, batch):
        """(the Pearson loss of the global batch, its pairs, what to back-propagate): the base step, with the batch's
        gold scores kept for `contrastive_objective` (gradient caching calls it on the whole batch's embeddings)."""
        if not isinstance(batch, Mapping) or "scores" not in batch:
            raise ConfigError(f"PccTuning trains on sentence pairs with gold similarity scores ({SCORED_DATA}); this "
                              "batch has no scores")
        if "pairs" not in batch:
            raise ConfigError("PccTuning reads raw sentence pairs; set data.pretokenize=false")
        self.step_scores = batch["scores"]
        try:
            return super().contrastive_loss(batch)
        finally:
            self.step_scores = None

    def contrastive_views(self, batch) -> tuple[torch.Tensor, torch.Tensor, None]:
        """(first sentences, second sentences, None), [n, D] each, from one forward of the 2n prompts."""
        pairs = list(batch["pairs"])
        pooled = self.pooled([first for first, _ in pairs] + [second for _, second in pairs], self.builders[0],
                             self.pooler)
        return pooled[: len(pairs)], pooled[len(pairs):], None

    def contrastive_objective(self, firsts: torch.Tensor, seconds: torch.Tensor, negatives=None) -> torch.Tensor:
        """1 − ρ(cos(u_k, v_k), y_k) over the global batch (every rank's pairs and scores)."""
        with torch.autocast(device_type=firsts.device.type, enabled=False):
            similarities = F.cosine_similarity(gather_with_grad(firsts).float(), gather_with_grad(seconds).float(),
                                               dim=1)
        scores = gather_with_grad(self.step_scores.to(similarities.device, torch.float32))
        return pearson_loss(similarities, scores, self.hparams.pearson)

    # -- checkpoints ----------------------------------------------------------------------------------------------

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        """The adapter only (PromptEOLSup's record); the adapter is complete, so the rebuild (PromptEOLSup's
        `load_checkpoint`, on the base alone) does not read stage one: its path and sha256 move to the adapter record,
        and the recorded arguments carry the LoRA settings resolved from it."""
        super().on_save_checkpoint(checkpoint)
        checkpoint[ADAPTER_RECORD]["stage_one_adapter"] = self.stage_one
        lora = {key: self.hparams[key] for key in LORA_DEFAULTS}
        checkpoint[RECORD_KEY]["arguments"] = {**checkpoint[RECORD_KEY]["arguments"], **lora,
                                               "stage_one_adapter": None}
        checkpoint["hyper_parameters"] = {**checkpoint["hyper_parameters"], "stage_one_adapter": None}
