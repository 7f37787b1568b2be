"""W&B sweep files (sweeps/*.yaml): validate them against train.py's config, sample one configuration,
and build the exact command a `wandb agent` would run for it, all without the W&B service.

    python -m promptemb.training.sweeps check sweeps/*.yaml          # every parameter is a train.py key/group
    python -m promptemb.training.sweeps command sweeps/optiprompt.yaml [--seed 0]   # what an agent would run

The command is built as wandb's agent builds it: `create_sweep_command` / `create_sweep_command_args` from
`wandb.sdk.launch.sweeps.utils` (imported when available) fill `${envvar:...}` and the `${args_no_hyphens}`
list (`f"{param}={value}"` per parameter); the `${env}` / `${interpreter}` / `${program}` macro loop of
`wandb_agent.Agent._command_run` is reproduced below (it lives inside the agent, which needs the service).
Sampling is local (the W&B sampler runs on the server): `value`, `values` (+ `probabilities`) and the
`distribution`s below.
"""

from __future__ import annotations

import argparse
import copy
import math
import random
import shlex
import sys
from pathlib import Path
from typing import Any

import yaml

from promptemb.common.cli import unknown_key_message
from promptemb.common.errors import ConfigError, exit_on_user_error
from promptemb.common.hydra_bridge import compose
from promptemb.configs import CONFIG_DIR
from promptemb.training.command_line import experiment_names

HYDRA_ARG_MACROS = ("${args_no_hyphens}", "${args_append_hydra}", "${args_override_hydra}")
DISTRIBUTIONS = ("constant", "categorical", "int_uniform", "uniform", "q_uniform", "log_uniform_values",
                 "q_log_uniform_values", "log_uniform", "normal")


def load_sweep(path: str | Path) -> dict:
    path = Path(path)
    try:
        spec = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"sweep file {path} does not exist") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"sweep {path}: not valid YAML ({str(err).splitlines()[0]})") from None
    if not isinstance(spec, dict):
        raise ConfigError(f"sweep {path}: expected a mapping with program, method, metric, parameters, command")
    return spec


def fixed_overrides(spec: dict) -> list[str]:
    """The command's own Hydra overrides (experiment=..., logger=...): everything that is not a macro."""
    return [str(item) for item in spec.get("command") or [] if not str(item).startswith(("${", "-"))]


def _is_group(key: str) -> bool:
    return bool(key) and "." not in key and (CONFIG_DIR / key).is_dir()


def _group_options(key: str) -> list[str]:
    return sorted(p.stem for p in (CONFIG_DIR / key).glob("*.yaml"))


def _spec_values(entry: dict) -> list | None:
    if "values" in entry:
        return list(entry["values"])
    if "value" in entry:
        return [entry["value"]]
    return None


def validate_sweep(spec: dict, where: str = "sweep") -> None:
    """Raise one-line ConfigErrors for anything a W&B agent run would trip on, naming the bad parameter."""
    program = spec.get("program")
    if Path(str(program)).name != "train.py":
        raise ConfigError(f"{where}: program must be train.py (got {program!r})")
    command = [str(c) for c in spec.get("command") or []]
    if "${program}" not in command or not any(m in command for m in HYDRA_ARG_MACROS):
        raise ConfigError(f"{where}: command must contain ${{program}} and ${{args_no_hyphens}} (Hydra key=value "
                          f"overrides); got {command}")
    if spec.get("method") not in ("grid", "random", "bayes"):
        raise ConfigError(f"{where}: method must be grid, random or bayes (got {spec.get('method')!r})")
    metric = spec.get("metric") or {}
    if spec["method"] == "bayes" and not metric.get("name"):
        raise ConfigError(f"{where}: bayes search needs metric.name (e.g. val/stsb_dev/mask) and metric.goal")
    if metric and metric.get("goal", "minimize") not in ("minimize", "maximize"):
        raise ConfigError(f"{where}: metric.goal must be minimize or maximize (got {metric.get('goal')!r})")
    fixed = fixed_overrides(spec)
    experiments = [o.split("=", 1)[1] for o in fixed if o.lstrip("+").startswith("experiment=")]
    for name in experiments:
        if name not in experiment_names():
            valid = ", ".join(experiment_names())
            raise ConfigError(f"{where}: unknown experiment {name!r} in command; valid: {valid}")
    parameters = spec.get("parameters")
    if not isinstance(parameters, dict) or not parameters:
        raise ConfigError(f"{where}: no parameters to sweep")
    base = compose("train", fixed, resolve=False)
    context = f"{where}: parameter " + (f"(experiment={experiments[0]}) " if experiments else "")
    for key, entry in parameters.items():
        if not isinstance(entry, dict) or "parameters" in entry:
            raise ConfigError(f"{where}: parameter {key!r} must be a mapping with value/values/distribution "
                              f"(nested parameters are not Hydra overrides: use dotted keys like optimizer.lr)")
        _check_entry(key, entry, where)
        if key.startswith("+"):
            continue  # explicitly new key (Hydra append)
        if _is_group(key):
            options = _group_options(key)
            bad = [v for v in _spec_values(entry) or [] if str(v) not in options]
            if bad or _spec_values(entry) is None:
                raise ConfigError(f"{where}: parameter {key!r} is the config group {key}/: values must be among "
                                  f"{', '.join(options)} (got {bad or entry})")
            continue
        node: Any = base
        for part in key.lstrip("~").split("."):
            if not isinstance(node, dict) or part not in node:
                raise ConfigError(unknown_key_message(key.lstrip("~"), "...", base, where=context))
            node = node[part]
    # the values must compose too (types, group options): one sampled configuration, exactly as overrides
    sampled = sample(spec, random.Random(0))
    try:
        compose("train", fixed + [f"{k}={v}" for k, v in sampled.items()], resolve=False)
    except Exception as err:
        raise ConfigError(f"{where}: sampled overrides {sampled} do not compose: "
                          f"{' '.join(str(err).split())}") from None


def _check_entry(key: str, entry: dict, where: str) -> None:
    if "value" in entry or "values" in entry:
        if "values" in entry and not entry["values"]:
            raise ConfigError(f"{where}: parameter {key!r} has an empty values list")
        return
    dist = entry.get("distribution", "uniform" if "min" in entry else None)
    if dist not in DISTRIBUTIONS:
        raise ConfigError(f"{where}: parameter {key!r}: distribution {dist!r} is not supported here "
                          f"(use values or one of {', '.join(DISTRIBUTIONS)})")
    needed = ("mu", "sigma") if dist == "normal" else ("min", "max") if dist not in ("constant",
                                                                                     "categorical") else ()
    missing = [name for name in needed if name not in entry]
    if missing:
        raise ConfigError(f"{where}: parameter {key!r} ({dist}) needs {', '.join(missing)}")


def sample_parameter(entry: dict, rng: random.Random) -> Any:
    values = _spec_values(entry)
    if values is not None:
        if "probabilities" in entry:
            return rng.choices(values, weights=entry["probabilities"], k=1)[0]
        return rng.choice(values)
    dist = entry.get("distribution", "uniform")
    lo, hi = entry.get("min"), entry.get("max")
    if dist == "int_uniform":
        return rng.randint(int(lo), int(hi))
    if dist == "uniform":
        return rng.uniform(lo, hi)
    if dist == "q_uniform":
        q = entry.get("q", 1.0)
        return round(rng.uniform(lo, hi) / q) * q
    if dist == "log_uniform_values":
        return math.exp(rng.uniform(math.log(lo), math.log(hi)))
    if dist == "q_log_uniform_values":
        q = entry.get("q", 1.0)
        return round(math.exp(rng.uniform(math.log(lo), math.log(hi))) / q) * q
    if dist == "log_uniform":  # min/max are exponents
        return math.exp(rng.uniform(lo, hi))
    if dist == "normal":
        return rng.gauss(entry["mu"], entry["sigma"])
    raise ConfigError(f"distribution {dist!r} is not supported (use one of {', '.join(DISTRIBUTIONS)})")


def sample(spec: dict, rng: random.Random | None = None) -> dict[str, Any]:
    """One configuration {parameter: value}, as the sweep controller would send it to an agent."""
    rng = rng or random.Random()
    return {key: sample_parameter(entry, rng) for key, entry in spec["parameters"].items()}


def _wandb_sweep_utils():
    try:
        from wandb.sdk.launch.sweeps import utils
        return utils
    except ImportError:  # pragma: no cover - wandb moved it: fall back to the documented rule below
        return None


def agent_command(spec: dict, params: dict[str, Any], interpreter: str = "python",
                  program: str | None = None) -> list[str]:
    """The argv `wandb agent` would run for `params` (`${env}` expands to /usr/bin/env as on Linux/macOS)."""
    command = copy.deepcopy(spec.get("command") or ["${env}", "${interpreter}", "${program}", "${args}"])
    run = {"args": {key: {"value": value} for key, value in params.items()}}
    utils = _wandb_sweep_utils()
    if utils is not None:
        command = utils.create_sweep_command(command)
        sweep_vars = utils.create_sweep_command_args(run)
    else:  # documented rule: ${args_no_hyphens} = [f"{param}={value}", ...]
        sweep_vars = {"args_no_hyphens": [f"{k}={v['value']}" for k, v in run["args"].items()]}
    sweep_vars["interpreter"] = [interpreter]
    sweep_vars["program"] = [program or str(spec["program"])]
    sweep_vars["env"] = ["/usr/bin/env"]
    argv: list[str] = []
    for chunk in map(str, command):  # as wandb_agent.Agent._command_run
        if chunk.startswith("${") and chunk.endswith("}"):
            argv += sweep_vars.get(chunk[2:-1]) or []
        else:
            argv.append(chunk)
    return argv


@exit_on_user_error
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m promptemb.training.sweeps", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="action", required=True)
    check = sub.add_parser("check", help="validate sweep files against train.py's config")
    check.add_argument("files", nargs="+")
    show = sub.add_parser("command", help="sample one configuration and print the command an agent would run")
    show.add_argument("file")
    show.add_argument("--seed", type=int, default=None)
    args = parser.parse_args(argv)
    if args.action == "check":
        for path in args.files:
            spec = load_sweep(path)
            validate_sweep(spec, where=f"sweep {path}")
            print(f"ok {path}: {len(spec['parameters'])} parameters ({', '.join(spec['parameters'])})")
    else:
        spec = load_sweep(args.file)
        validate_sweep(spec, where=f"sweep {args.file}")
        print(shlex.join(agent_command(spec, sample(spec, random.Random(args.seed)))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
