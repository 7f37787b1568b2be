"""Hyper-parameter search with Optuna's own API behind an `hparams_search/` config (lightning-hydra-template layout).

    python train.py experiment=quickstart_unsup hparams_search=quickstart_optuna

The search space uses Hydra's sweep syntax, as Hydra's Optuna sweeper does (`choice(...)`, `range(...)`,
`interval(a, b)`, `tag(log, interval(a, b))`); that plugin pins Optuna < 3, so the study runs here on the installed
Optuna instead. Every trial is a full train.py run in its own folder (`<run>/trials/<n>`) with the objective
`val/stsb_dev/mask_best` (the best STS-B dev [MASK] score). A failed trial is told to the study as failed and the
search goes on; the end prints one table of all trials and exits non-zero if any failed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from promptemb.common.cli import split_override
from promptemb.common.errors import ConfigError
from promptemb.common.io import atomic_write_json
from promptemb.common.optional import require
from promptemb.common.run_folder import nothing_left_on_user_error
from promptemb.training.run_dirs import STUDY_TRIAL_OVERRIDES
from promptemb.training.trials import (
    COMPLETED,
    INTERRUPTED,
    RunInterruptedError,
    TrialOutcome,
    exit_if_failed,
    summarise,
    task_overrides,
    trial,
)

log = logging.getLogger(__name__)


def search_space(params: dict) -> dict:
    """Optuna distributions from Hydra sweep expressions, one per config key."""
    import optuna.distributions as dist
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import ChoiceSweep, IntervalSweep, RangeSweep

    parser = OverridesParser.create()
    space = {}
    for key, expression in params.items():
        try:
            override = parser.parse_override(f"{key}={expression}")
        except Exception as err:
            raise ConfigError(f"hparams_search.params.{key}: cannot parse {expression!r} ({err})") from None
        sweep = override.value()
        if isinstance(sweep, (ChoiceSweep, RangeSweep)):
            space[key] = dist.CategoricalDistribution(list(override.sweep_iterator()))
        elif isinstance(sweep, IntervalSweep):
            log_scale = "log" in sweep.tags
            if isinstance(sweep.start, int) and isinstance(sweep.end, int):
                space[key] = dist.IntDistribution(sweep.start, sweep.end, log=log_scale)
            else:
                space[key] = dist.FloatDistribution(float(sweep.start), float(sweep.end), log=log_scale)
        else:
            raise ConfigError(f"hparams_search.params.{key}: {expression!r} is not a search space; use choice(...), "
                              "range(...), interval(a, b) or tag(log, interval(a, b))")
    if not space:
        raise ConfigError("hparams_search.params is empty; name at least one key to search, e.g. "
                          "optimizer.lr: tag(log, interval(1e-5, 1e-4))")
    return space


def check_keys(cfg: DictConfig, keys: list[str]) -> None:
    missing = [key for key in keys if not key.startswith("+") and OmegaConf.select(cfg, key, default=None) is None]
    if missing:
        raise ConfigError(f"hparams_search.params: {', '.join(missing)} is not a key of train.py's config")


def check_not_searched(overrides: list[str], searched: list[str]) -> None:
    """A command-line value for a key the study searches would be replaced in every trial: refused in one line."""
    searched_keys = {name.lstrip("+") for name in searched}
    for override in overrides:
        _, key, _ = split_override(override)
        if key in searched_keys:
            raise ConfigError(f"{key}= is searched by hparams_search (hparams_search.params.{key}): every trial sets "
                              f"its own value; drop it from the command line, or the key from hparams_search.params")


def override_value(value) -> str:
    return repr(value) if isinstance(value, float) else str(value)


def run_study(cfg: DictConfig, objective: Callable[[DictConfig], float | None]) -> float | None:
    """Run the configured study, each trial `objective(trial_cfg)` (a train.py run: the best dev score it reached);
    returns the best objective (None if no trial completed)."""
    optuna = require("optuna", "hparams_search (Optuna)")
    from hydra import compose
    from hydra.utils import instantiate

    search = cfg.hparams_search
    space = search_space(OmegaConf.to_container(search.params, resolve=True))
    base = [o for o in task_overrides() if not o.lstrip("+~").startswith(("hparams_search", "output_dir="))]
    with nothing_left_on_user_error():  # a refused study leaves no folder behind
        check_keys(cfg, list(space))
        check_not_searched(base, list(space))
        if int(search.n_trials) < 1:
            raise ConfigError(f"hparams_search.n_trials must be >= 1, got {search.n_trials}")
    study_dir = Path(cfg.output_dir)
    sampler = instantiate(search.sampler) if search.get("sampler") else None
    study = optuna.create_study(study_name=search.get("study_name"), direction=search.direction, sampler=sampler,
                                storage=search.get("storage"), load_if_exists=bool(search.get("storage")))
    for params in search.get("enqueue") or []:
        study.enqueue_trial(OmegaConf.to_container(params, resolve=True))
    base = [o for o in task_overrides() if not o.lstrip("+~").startswith(("hparams_search", "output_dir="))]
    rows = []
    for number in range(int(search.n_trials)):
        asked = study.ask(space)
        trial_dir = study_dir / "trials" / str(number)
        overrides = [*base, *(f"{key}={override_value(value)}" for key, value in asked.params.items()),
                     f"output_dir={trial_dir}", "~hparams_search"]
        log.info("trial %d: %s", number, asked.params)
        token = STUDY_TRIAL_OVERRIDES.set(overrides)  # what a stopped trial's resume command repeats
        try:
            outcome = run_study_trial(compose, overrides, trial_dir, objective, asked.params)
        except RunInterruptedError as err:  # Ctrl-C: the study stops; what ran so far is written down
            study.tell(asked, state=optuna.trial.TrialState.FAIL)
            rows.append({"trial": number, "status": INTERRUPTED, "objective": None, "params": asked.params,
                         "reason": str(err), "run_dir": str(trial_dir)})
            write_study(study, search, study_dir, rows, optuna)
            raise
        finally:
            STUDY_TRIAL_OVERRIDES.reset(token)
        if outcome.status == COMPLETED and outcome.objective is not None:
            study.tell(asked, outcome.objective)
        else:
            study.tell(asked, state=optuna.trial.TrialState.FAIL)
        rows.append({"trial": number, "status": outcome.status, "objective": outcome.objective,
                     "params": asked.params, "reason": outcome.reason, "run_dir": str(trial_dir)})
    failed, best = write_study(study, search, study_dir, rows, optuna)
    if best is not None:
        log.info("best trial %d: %.2f with %s", best.number, best.value, best.params)
    exit_if_failed(failed, len(rows), study_dir)
    return best.value if best else None


def run_study_trial(compose, overrides: list[str], trial_dir: Path, objective, params: dict) -> TrialOutcome:
    """One trial of the study: `objective` of train.py's config with the trial's overrides, in `trial_dir`."""
    with trial(trial_dir, in_sweep=True, overrides=overrides, params=params) as outcome:
        try:
            trial_cfg = compose(config_name="train", overrides=overrides)
        except Exception:  # an impossible combination: a failed trial, not a failed study
            trial_dir.mkdir(parents=True, exist_ok=True)
            raise
        outcome.objective = objective(trial_cfg)
    return outcome


def write_study(study, search: DictConfig, study_dir: Path, rows: list[dict], optuna):
    """study.json and the table of the trials so far: (how many did not complete, the best trial or None)."""
    completed = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    best = study.best_trial if completed else None
    atomic_write_json(study_dir / "study.json", {
        "study_name": study.study_name, "direction": search.direction, "objective": "val/stsb_dev/mask_best",
        "best": {"trial": best.number, "value": best.value, "params": best.params} if best else None,
        "trials": [{"number": t.number, "state": t.state.name, "value": t.value, "params": t.params}
                   for t in study.trials]})
    failed = summarise(rows, study_dir, f"Optuna study {study.study_name} ({search.direction} val/stsb_dev/mask_best)")
    return failed, best
