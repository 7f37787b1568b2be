"""Training throughput of a recipe: steps/s, sentences/s, real tokens/s, the step split into phases, peak memory,
achieved FLOP/s and MFU.

    python bench/train_throughput.py experiment=quickstart_unsup data.batch_size=32 [hydra overrides ...]
        [--steps 10] [--warmup 2] [--device auto|cpu|cuda] [--threads N] [--peak-tflops T] [--out result.json]
        [--data-only N]   # the data path alone: loader wait + input tensors per batch, no model step

The recipe is composed exactly as train.py composes it (same module, data module, precision from `trainer.precision`,
gradient clipping from `trainer.gradient_clip_val`), so `model.grad_cache_chunk_size=16` or
`model.gradient_checkpointing=true` measure those options. The loop is Lightning's automatic-optimisation step
written out so each phase can be timed (on a GPU every phase boundary synchronises):

- data wait: `next()` on the recipe's training DataLoader and the batch's transfer to the device;
- inputs: turning the batch into the model's input tensors inside the step (`module.view_batch`): tokenizing,
  templating and padding raw sentences (`data.pretokenize=false`), or only wrapping pre-tokenized ids in the
  template (the default);
- forward: `module.contrastive_loss` (views, heads, InfoNCE; under gradient caching pass 1), inputs and bias
  forwards excluded;
- denoising: the template-bias forwards (their backward is part of backward);
- backward: back-propagation (under gradient caching pass 2: re-forward and backward of every chunk but the last);
- optimiser: gradient clipping, the configured optimiser's step (AdamW), LR-schedule step, zero_grad.

Besides wall time it reports the process's CPU time per step (all threads): on a shared CPU, where wall time
depends on what else runs, that is the steadier measure of the work a step does.

FLOP model (docs/benchmarks.md): each transformer call contributes, per row of real (unpadded) length n,
2·P·n + 4·L·d·n² forward FLOPs (P = L·(4d² + 2·d·f) weight-matrix parameters, the second term attention scores and
values); training counts 3x forward for a trainable encoder, 2x for a frozen one (OptiPrompt: activation gradients
only) and 1x for frozen biases. Only the forward the step needs is counted: gradient caching's second forward and
checkpointing's recomputation are overhead, so they lower the MFU. MFU = achieved FLOP/s / `--peak-tflops`.
"""

from __future__ import annotations

import argparse
import contextlib
import platform
import resource
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from promptemb.common.errors import ConfigError, UserError
from promptemb.common.instantiate import build
from promptemb.common.io import atomic_write_json
from promptemb.lightning_modules.losses import world_size
from promptemb.training.command_line import compose_train
from promptemb.training.runner import build_module

PHASES = ("data_wait", "inputs", "forward", "denoising", "backward", "optimiser")
AUTOCAST = {"32-true": None, "32": None, "bf16-mixed": torch.bfloat16, "bf16": torch.bfloat16}


class Clock:
    """Phase timer that synchronises the accelerator at every boundary, so GPU work lands in its own phase."""

    def __init__(self, device: torch.device):
        self.device = device

    def now(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()


class FlopCounter:
    """Model FLOPs and real tokens of every transformer call made while `counting` (see the module docstring)."""

    def __init__(self, module, clock: Clock):
        config = module.transformer.config
        layers, hidden = int(config.num_hidden_layers), int(config.hidden_size)
        self.matrix_params = layers * (4 * hidden * hidden + 2 * hidden * int(config.intermediate_size))
        self.attention = 4 * layers * hidden
        trainable_encoder = any(p.requires_grad for p in module.transformer.parameters())
        self.sentence_factor = 3 if trainable_encoder else 2
        self.bias_factor = 1 if module.hparams.freeze_bias else self.sentence_factor
        self.counting = False
        self.flops = 0.0
        self.sentence_tokens = self.bias_tokens = 0
        module.transformer.register_forward_pre_hook(self._count, with_kwargs=True)

    def _count(self, _module, args, kwargs) -> None:
        if not self.counting:
            return
        lengths = kwargs["attention_mask"].sum(1).double()
        forward = float((2 * self.matrix_params * lengths + self.attention * lengths**2).sum())
        if kwargs.get("position_ids") is None:  # sentence rows (the template-only bias rows carry shifted positions)
            self.sentence_tokens += int(lengths.sum())
            self.flops += self.sentence_factor * forward
        else:
            self.bias_tokens += int(lengths.sum())
            self.flops += self.bias_factor * forward


class MethodTimer:
    """Wall seconds spent inside `module.<name>` (its calls never nest), to move them out of the enclosing phase."""

    def __init__(self, module, name: str, clock: Clock):
        self.seconds = 0.0
        method = getattr(module, name)

        def timed(*args, **kwargs):
            start = clock.now()
            result = method(*args, **kwargs)
            self.seconds += clock.now() - start
            return result

        setattr(module, name, timed)


def peak_memory(device: torch.device) -> dict:
    if device.type == "cuda":
        return {"peak_gpu_memory_gib": torch.cuda.max_memory_allocated(device) / 2**30}
    # ru_maxrss: KiB on Linux; the whole process (Python, the model, the optimiser state, activations)
    return {"peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}


def batches(loader, module, device):
    while True:  # small corpora: start another epoch
        for batch in loader:
            yield module.transfer_batch_to_device(batch, device, 0)


def _setup(cfg, device: torch.device):
    torch.manual_seed(int(cfg.seed))
    module = build_module(cfg).to(device).train()
    datamodule = build(cfg.data)
    datamodule.use_tokenization(module.sentence_tokenization())  # what a trainer's setup does (data.pretokenize)
    datamodule.setup("fit")
    return module, datamodule


def data_path(cfg, count: int, device: torch.device) -> dict:
    """The data path alone (no model forward): per batch, the loader's wait and building every view's input tensors
    (`module.view_batch`), in milliseconds: what the data costs a step whatever the device computes."""
    module, datamodule = _setup(cfg, device)
    clock = Clock(device)
    stream = batches(datamodule.train_dataloader(), module, device)
    waits, builds = [], []
    for _ in range(count):
        start = clock.now()
        batch = next(stream)
        ready = clock.now()
        if isinstance(batch, dict) and batch["ids"].dim() == 3:  # triplets: the rows the module encodes
            batch = {"ids": batch["ids"].flatten(0, 1), "lengths": batch["lengths"].flatten()}
        elif not isinstance(batch, dict) and not isinstance(batch[0], str):
            batch = [sentence for example in batch for sentence in example]
        for builder in module.builders:
            module.view_batch(batch, builder)
        waits.append(ready - start)
        builds.append(clock.now() - ready)
    return {"batches": count, "data_wait_ms": 1e3 * statistics.mean(waits), "inputs_ms": 1e3 * statistics.mean(builds),
            "data_path_ms": 1e3 * statistics.mean(w + b for w, b in zip(waits, builds, strict=True))}


def run(cfg, steps: int, warmup: int, device: torch.device) -> dict:
    precision = str(cfg.trainer.precision)
    if precision not in AUTOCAST:
        raise ConfigError(f"trainer.precision={precision} is not supported by the benchmark; use 32-true or bf16-mixed")
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True  # what trainer=gpu runs with
        torch.backends.cudnn.allow_tf32 = True
    module, datamodule = _setup(cfg, device)
    params = [p for p in module.parameters() if p.requires_grad]
    optimizer = module.optimizer_factory(params)
    scheduler = module.scheduler_factory(optimizer, warmup + steps + 1)
    clip = cfg.trainer.get("gradient_clip_val")
    dtype = AUTOCAST[precision]
    clock = Clock(device)
    counter = FlopCounter(module, clock)
    denoising, inputs = MethodTimer(module, "compute_template_biases", clock), MethodTimer(module, "view_batch", clock)
    stream = batches(datamodule.train_dataloader(), module, device)
    rows, phases = [], []
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    cpu_seconds = []
    for step in range(warmup + steps):
        timed = step >= warmup
        counter.counting, denoising.seconds, inputs.seconds = False, 0.0, 0.0
        times = dict.fromkeys(PHASES, 0.0)
        start = clock.now()
        cpu_start = time.process_time()
        batch = next(stream)
        times["data_wait"] = clock.now() - start
        autocast = torch.autocast(device.type, dtype=dtype) if dtype else contextlib.nullcontext()
        start = clock.now()
        with autocast:
            counter.counting = timed
            loss, examples, to_backward = module.contrastive_loss(batch)
            counter.counting = False
            if not torch.isfinite(loss):
                raise UserError(f"loss is {loss.item()} at step {step}")
            in_forward = denoising.seconds + inputs.seconds
            times["forward"] = clock.now() - start - in_forward
            start = clock.now()
            to_backward(loss * world_size()).backward()
        times["backward"] = clock.now() - start - (denoising.seconds + inputs.seconds - in_forward)
        times["denoising"], times["inputs"] = denoising.seconds, inputs.seconds
        start = clock.now()
        if clip:
            torch.nn.utils.clip_grad_norm_(params, float(clip))
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        times["optimiser"] = clock.now() - start
        if timed:
            phases.append(times)
            rows.append(examples)
            cpu_seconds.append(time.process_time() - cpu_start)
    total = sum(sum(t.values()) for t in phases)
    sentences = _sentences_per_example(module) * sum(rows)
    achieved = counter.flops / total
    return {
        "steps": steps,
        "step_seconds_mean": total / steps,
        "step_seconds_median": statistics.median(sum(t.values()) for t in phases),
        # CPU time of this process (all threads) per step: on a shared CPU a steadier measure of the work than wall
        "step_cpu_seconds_mean": sum(cpu_seconds) / steps,
        "steps_per_s": steps / total,
        "examples_per_s": sum(rows) / total,
        "sentences_per_s": sentences / total,
        "real_tokens_per_s": counter.sentence_tokens / total,
        "bias_tokens_per_step": counter.bias_tokens / steps,
        "phase_seconds_mean": {p: sum(t[p] for t in phases) / steps for p in PHASES},
        "phase_fraction": {p: sum(t[p] for t in phases) / total for p in PHASES},
        # what feeding the model costs the step: waiting for the loader plus building input tensors in the step
        "data_fraction": sum(t["data_wait"] + t["inputs"] for t in phases) / total,
        "model_flops_per_step": counter.flops / steps,
        "achieved_tflops": achieved / 1e12,
        **peak_memory(device),
    }


def _sentences_per_example(module) -> int:
    """Sentences a training example holds: NLI triplets 3, unsupervised examples 1 (encoded in two views)."""
    return 3 if type(module).__name__ == "PromptBERTSup" else 1


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10, help="timed steps (after --warmup untimed ones)")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--device", default="auto", help="auto (cuda when available), cpu or cuda[:i]")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--peak-tflops", type=float, default=None,
                        help="the device's peak dense TFLOP/s at the run's precision, for MFU (e.g. H100 SXM bf16 989)")
    parser.add_argument("--out", type=Path, default=None, help="write the result as JSON here")
    parser.add_argument("--data-only", type=int, default=None, metavar="N",
                        help="time only the data path (loader wait + input tensors, no model step) over N batches")
    args, overrides = parser.parse_known_args(argv)
    unknown = [o for o in overrides if o.startswith("--")]
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available() else
                          "cpu" if args.device == "auto" else args.device)
    try:
        cfg = compose_train(overrides)
        if args.data_only:
            result = data_path(cfg, args.data_only, device)
            print(f"data path: {result['data_path_ms']:.2f} ms per batch (loader wait {result['data_wait_ms']:.2f} ms, "
                  f"input tensors {result['inputs_ms']:.2f} ms) over {args.data_only} batches")
            if args.out:
                atomic_write_json(args.out, {**result, "overrides": overrides})
            return
        result = run(cfg, args.steps, args.warmup, device)
    except UserError as err:
        sys.exit(f"error: {err}")
    if args.peak_tflops:
        result["peak_tflops"] = args.peak_tflops
        result["mfu"] = result["achieved_tflops"] / args.peak_tflops
    result["setup"] = {
        "overrides": overrides, "model": str(cfg.model.model_name_or_path), "batch_size": int(cfg.data.batch_size),
        "precision": str(cfg.trainer.precision), "grad_cache_chunk_size": cfg.model.get("grad_cache_chunk_size"),
        "gradient_checkpointing": bool(cfg.model.get("gradient_checkpointing", False)),
        "pretokenize": bool(cfg.data.get("pretokenize", False)), "num_workers": cfg.data.get("num_workers"),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
    }
    print(format_result(result))
    if args.out:
        atomic_write_json(args.out, result)


def format_result(result: dict) -> str:
    fractions = "  ".join(f"{p} {100 * f:.1f}%" for p, f in result["phase_fraction"].items())
    memory = ", ".join(f"{k} {v:.2f}" for k, v in result.items() if k.startswith("peak_") and k.endswith("gib"))
    lines = [
        f"{result['setup']['model']}  batch {result['setup']['batch_size']}  {result['setup']['precision']}  "
        f"grad_cache {result['setup']['grad_cache_chunk_size']}  checkpointing "
        f"{result['setup']['gradient_checkpointing']}  pretokenize {result['setup']['pretokenize']}  "
        f"on {result['setup']['device']}",
        f"step {result['step_seconds_mean']:.3f} s (median {result['step_seconds_median']:.3f}, "
        f"CPU time {result['step_cpu_seconds_mean']:.3f} s)  "
        f"{result['steps_per_s']:.3f} steps/s  {result['sentences_per_s']:.1f} sentences/s  "
        f"{result['real_tokens_per_s']:.0f} real tokens/s",
        f"phases: {fractions}  (data wait + inputs {100 * result['data_fraction']:.2f}%)",
        f"{result['achieved_tflops']:.4f} TFLOP/s achieved" + (f", MFU {100 * result['mfu']:.2f}%"
                                                                if "mfu" in result else "") + f"; {memory}",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
