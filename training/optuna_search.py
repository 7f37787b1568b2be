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

from promptemb.common.cli import split_override
from promptemb.common.errors import ConfigError
from promptemb.common.instantiate import build
from promptemb.common.io import atomic_write_json
from promptemb.common.optional import require
from promptemb.common.run_context import RunContext
from promptemb.common.run_folder import nothing_left_on_user_error
from promptemb.training.run_folder import Outcome, RunInterruptedError, outcome
from promptemb.training.settings import OptunaSearch, TrainSettings
from promptemb.training.trials import COMPLETED, INTERRUPTED, exit_if_failed, summarise

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


def check_keys(values: dict, keys: list[str]) -> None:
    missing = [key for key in keys if not key.startswith("+") and lookup(values, key) is None]
    if missing:
        raise ConfigError(f"hparams_search.params: {', '.join(missing)} is not a key of train.py's config")


def lookup(values: dict, key: str):
    for part in key.split("."):
        values = values.get(part) if isinstance(values, dict) else None
    return values


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


#: One trial: train.py's config composed with these overrides, checked and trained in `RunContext`'s trial; returns
#: the objective (training/command_line.py).
TrainTrial = Callable[[list[str], RunContext], float | None]


def run_study(settings: TrainSettings, context: RunContext, train_trial: TrainTrial) -> float | None:
    """Run the study configured in `settings.hparams_search`, each trial `train_trial(overrides, context)` (a
    train.py run in its own folder: the best dev score it reached); returns the best objective (None if no trial
    completed)."""
    optuna = require("optuna", "hparams_search (Optuna)")
    search = settings.hparams_search
    space = search_space(search.params)
    base = [o for o in context.overrides if not o.lstrip("+~").startswith(("hparams_search", "output_dir="))]
    with nothing_left_on_user_error(context.run_dir):  # a refused study leaves no folder behind
        check_keys(settings.resolved, list(space))
        check_not_searched(base, list(space))
    study_dir = Path(settings.output_dir)
    sampler = build(search.sampler) if search.sampler else None
    study = optuna.create_study(study_name=search.study_name, direction=search.direction, sampler=sampler,
                                storage=search.storage, load_if_exists=bool(search.storage))
    for params in search.enqueue:
        study.enqueue_trial(params)
    rows = []
    for number in range(search.n_trials):
        asked = study.ask(space)
        trial_dir = study_dir / "trials" / str(number)
        overrides = [*base, *(f"{key}={override_value(value)}" for key, value in asked.params.items()),
                     f"output_dir={trial_dir}", "~hparams_search"]
        log.info("trial %d: %s", number, asked.params)
        trial_context = context.for_trial(number, overrides)  # what a stopped trial's resume command repeats
        try:
            outcome = run_study_trial(train_trial, trial_dir, trial_context, asked.params)
        except RunInterruptedError as err:  # Ctrl-C: the study stops; what ran so far is written down
            study.tell(asked, state=optuna.trial.TrialState.FAIL)
            rows.append({"trial": number, "status": INTERRUPTED, "objective": None, "params": asked.params,
                         "reason": str(err), "run_dir": str(trial_dir)})
            write_study(study, search, study_dir, rows, optuna)
            raise
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


def run_study_trial(train_trial: TrainTrial, trial_dir: Path, context: RunContext, params: dict) -> Outcome:
    """One trial of the study, recorded in `trial_dir` (a failure is a failed trial, not a failed study)."""
    with outcome(trial_dir, context, params) as result:
        result.objective = train_trial(list(context.overrides), context)
    return result


def write_study(study, search: OptunaSearch, study_dir: Path, rows: list[dict], optuna):
    """study.json and the table of the trials so far: (how many did not complete, the best trial or None)."""
    completed = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    best = study.best_trial if completed else None
    atomic_write_json(study_dir / "study.json", {
        "study_name": study.study_name, "direction": search.direction, "objective": "val/stsb_dev/mask_best",
        "best": {"trial": best.number, "value": best.value, "params": best.params} if best else None,
        "trials": [{"number": t.number, "state": t.state.name, "value": t.value, "params": t.params}
                   for t in study.trials]})
    title = f"Optuna study {study.study_name} ({search.direction} val/stsb_dev/mask_best)"
    failed = summarise(rows, study_dir, title)
    return failed, best
