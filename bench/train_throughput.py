"""Training throughput of a recipe: steps/s, sentences/s, real tokens/s, the step split into phases, peak memory,
achieved FLOP/s and MFU.

    python bench/train_throughput.py experiment=quickstart_unsup data.batch_size=32 [train.py overrides ...]
        [--mode both|loop|phases] [--steps 10] [--warmup 2] [--device auto|cpu|cuda] [--threads N]
        [--random-bert LAYERS:HIDDEN] [--peak-tflops T] [--out result.json]
        [--data-only N]   # the data path alone: loader wait + input tensors per batch, no model step

Two measurements (`--mode both`, the default):

- loop: train.py's own `train(settings)` (its composition and checks, the Lightning Trainer with the configured
  precision, `trainer.compile`, device profile, optimiser and clipping, logging and progress bar; no STS-B dev
  evaluation or checkpoint inside the run), timed from the start of step `--warmup` to the start of step
  `--warmup + --steps` with one device synchronisation at each end and none in between: its steps/s is the real
  loop's. Compilation happens in the warm-up steps (its time is reported apart).
- phases: Lightning's automatic-optimisation step written out so each phase can be timed; on a GPU every phase
  boundary synchronises, so the phase times are upper bounds (launch latency shows up in each phase):

  - data wait: `next()` on the recipe's training DataLoader and the batch's transfer to the device;
  - inputs: turning the batch into the model's input tensors inside the step (`module.view_batch`): tokenizing,
    templating and padding raw sentences (`data.pretokenize=false`), or only wrapping pre-tokenized ids in the
    template (the default);
  - forward: `module.contrastive_loss` (views and their template biases in one transformer call, heads, InfoNCE;
    under gradient caching pass 1), inputs and gradient caching's bias forwards excluded;
  - denoising: gradient caching's separate template-bias forwards (their backward is part of backward; without
    gradient caching the biases ride in the forward);
  - backward: back-propagation (under gradient caching pass 2: re-forward and backward of every chunk but the last);
  - optimiser: gradient clipping, the configured optimiser's step (as configured, without the device profile's
    implementation choice: the loop has that), LR-schedule step, zero_grad.

Both build the recipe exactly as train.py does, so `model.grad_cache_chunk_size=16`, `model.gradient_checkpointing=true`
or `trainer.compile=true` measure those options (the phases apply `trainer.compile` as the Trainer does). CUDA-only
choices are refused in one line where there is no CUDA device.

`--random-bert 12:64` trains a randomly initialised BERT with bert-base's layout (12 layers, 12 heads) at that width
instead of `backbone.name_or_path` (bench/step_counts.py `save_random_bert`).

Besides wall time it reports the process's CPU time per step (all threads): on a shared CPU, where wall time
depends on what else runs, that is the steadier measure of the work a step does.

FLOP model (docs/benchmarks.md): each transformer call contributes, per row of real (unpadded) length n,
2·P·n + 4·L·d·n² forward FLOPs (P = L·(4d² + 2·d·f) weight-matrix parameters, the second term attention scores and
values; a template-only segment packed into a row with others counts as a row of its own length); training counts
3x forward for a trainable encoder, 2x for a frozen one (OptiPrompt: activation gradients only) and 1x for frozen
biases. Only the forward the step needs is counted: gradient caching's second forward and checkpointing's
recomputation are overhead, so they lower the MFU. MFU = achieved FLOP/s / `--peak-tflops`. The counts are kept on
the device (no synchronisation inside the loop) and read once at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import platform
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pytorch_lightning as pl
import torch

import promptemb.encoder.forward as encoder_forward
import promptemb.lightning_modules.base as base
from promptemb.common.device_profile import DeviceProfile
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
    """Model FLOPs and real tokens of every transformer call made while `counting` (see the module docstring): the
    training forward (`training_forward`: sentence rows, then template-only segments packed into rows) and any
    separate forward (`run_transformer`: gradient caching's bias forward, whose rows have shifted position ids).
    Kept on the device, read once (`totals`)."""

    def __init__(self, module):
        config = module.transformer.config
        layers, hidden = int(config.num_hidden_layers), int(config.hidden_size)
        self.matrix_params = layers * (4 * hidden * hidden + 2 * hidden * int(config.intermediate_size))
        self.attention = 4 * layers * hidden
        trainable_encoder = any(p.requires_grad for p in module.transformer.parameters())
        self.sentence_factor = 3 if trainable_encoder else 2
        self.bias_factor = 1 if module.hparams.freeze_bias else self.sentence_factor
        self.counting = False
        self._sums: torch.Tensor | None = None  # flops, sentence tokens, bias tokens
        self._originals = base.training_forward, encoder_forward.run_transformer
        training_forward, run_transformer = self._originals

        def counted_training_forward(transformer, batch, *args, **kwargs):
            if self.counting:
                sentence = batch.attention_mask.sum(1).double()
                bias = kwargs.get("bias_rows")
                segments = None if bias is None else bias.segments
                if segments is not None:  # tokens of each (row, segment): segment k of a row is marked k, padding -1
                    per_row = torch.nn.functional.one_hot(segments + 1, segments.shape[1] + 1)[:, :, 1:].sum(1)
                    segments = per_row.double().flatten()
                self._add(sentence, segments)
            return training_forward(transformer, batch, *args, **kwargs)

        def counted_run_transformer(transformer, batch, *args, **kwargs):
            if self.counting:
                lengths = batch.attention_mask.sum(1).double()
                self._add(None, lengths) if batch.position_ids is not None else self._add(lengths, None)
            return run_transformer(transformer, batch, *args, **kwargs)

        base.training_forward = counted_training_forward
        encoder_forward.run_transformer = counted_run_transformer

    def _add(self, sentence: torch.Tensor | None, bias: torch.Tensor | None) -> None:
        parts = []
        for lengths, factor in ((sentence, self.sentence_factor), (bias, self.bias_factor)):
            if lengths is None:
                parts.append(torch.zeros(2, dtype=torch.float64, device=(sentence if bias is None else bias).device))
                continue
            forward = 2 * self.matrix_params * lengths.sum() + self.attention * (lengths**2).sum()
            parts.append(torch.stack([factor * forward, lengths.sum()]))
        step = torch.stack([parts[0][0] + parts[1][0], parts[0][1], parts[1][1]])
        self._sums = step if self._sums is None else self._sums + step

    def totals(self) -> tuple[float, int, int]:
        """(model FLOPs, sentence tokens, bias tokens) counted so far (one read of the device)."""
        if self._sums is None:
            return 0.0, 0, 0
        flops, sentence, bias = self._sums.tolist()
        return flops, int(sentence), int(bias)

    def close(self) -> None:
        base.training_forward, encoder_forward.run_transformer = self._originals


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


def apply_compile(cfg, module) -> None:
    """`trainer.compile=true` as the Trainer applies it (training/trainer.py `CompileBackbone`), refused in one line
    where torch.compile cannot run."""
    if cfg.trainer.get("compile"):
        from promptemb.training.trainer import CompileBackbone, check_compile

        check_compile(True, cfg.trainer.get("accelerator"))
        CompileBackbone().setup(None, module, "fit")


def run(cfg, steps: int, warmup: int, device: torch.device) -> dict:
    """The phases: the step written out, each phase timed (synchronising the device at every boundary)."""
    precision = str(cfg.trainer.precision)
    if precision not in AUTOCAST:
        raise ConfigError(f"trainer.precision={precision} is not supported by the benchmark; use 32-true or bf16-mixed")
    DeviceProfile.for_device(device, precision).apply_training_matmul_precision()  # what trainer=gpu runs with
    module, datamodule = _setup(cfg, device)
    apply_compile(cfg, module)
    params = [p for p in module.parameters() if p.requires_grad]
    optimizer = module.optimizer_factory(params)
    scheduler = module.scheduler_factory(optimizer, warmup + steps + 1)
    clip = cfg.trainer.get("gradient_clip_val")
    dtype = AUTOCAST[precision]
    clock = Clock(device)
    counter = FlopCounter(module)
    denoising, inputs = MethodTimer(module, "compute_template_biases", clock), MethodTimer(module, "view_batch", clock)
    stream = batches(datamodule.train_dataloader(), module, device)
    rows, phases = [], []
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    cpu_seconds = []
    try:
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
        flops, sentence_tokens, bias_tokens = counter.totals()
    finally:
        counter.close()
    total = sum(sum(t.values()) for t in phases)
    sentences = _sentences_per_example(module) * sum(rows)
    return {
        "steps": steps,
        "step_seconds_mean": total / steps,
        "step_seconds_median": statistics.median(sum(t.values()) for t in phases),
        # CPU time of this process (all threads) per step: on a shared CPU a steadier measure of the work than wall
        "step_cpu_seconds_mean": sum(cpu_seconds) / steps,
        "steps_per_s": steps / total,
        "examples_per_s": sum(rows) / total,
        "sentences_per_s": sentences / total,
        "real_tokens_per_s": sentence_tokens / total,
        "bias_tokens_per_step": bias_tokens / steps,
        "phase_seconds_mean": {p: sum(t[p] for t in phases) / steps for p in PHASES},
        "phase_fraction": {p: sum(t[p] for t in phases) / total for p in PHASES},
        # what feeding the model costs the step: waiting for the loader plus building input tensors in the step
        "data_fraction": sum(t["data_wait"] + t["inputs"] for t in phases) / total,
        "model_flops_per_step": flops / steps,
        "achieved_tflops": flops / total / 1e12,
        **peak_memory(device),
    }


class LoopTimer(pl.Callback):
    """Times steps `warmup` .. `warmup + steps` of the real loop: one device synchronisation at the start of each
    end, none in between. Counts the model FLOPs of those steps on the device (read after the window)."""

    def __init__(self, steps: int, warmup: int):
        self.steps, self.warmup = steps, warmup
        self.counter: FlopCounter | None = None
        self.started = self.cpu_started = self.fit_started = None
        self.result: dict = {}
        self.examples = 0

    def on_train_start(self, trainer, module) -> None:
        self.counter = FlopCounter(module)
        self.in_window = False
        contrastive_loss = module.contrastive_loss

        def counted(batch):  # the forward the step needs (gradient caching's pass 2 runs later, in the backward)
            self.counter.counting = self.in_window
            try:
                return contrastive_loss(batch)
            finally:
                self.counter.counting = False

        module.contrastive_loss = counted
        if module.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(module.device)
        self.fit_started = time.perf_counter()

    def _now(self, module) -> float:
        if module.device.type == "cuda":
            torch.cuda.synchronize(module.device)
        return time.perf_counter()

    def on_train_batch_start(self, trainer, module, batch, batch_idx) -> None:
        step = trainer.global_step
        if step == self.warmup:
            self.started, self.cpu_started = self._now(module), time.process_time()
            self.result["warmup_seconds"] = self.started - self.fit_started  # compilation included
            self.in_window = True
        elif step == self.warmup + self.steps and self.started is not None:
            self._stop(trainer, module)
        if self.in_window:
            self.examples += _examples(batch)

    def on_train_end(self, trainer, module) -> None:
        if self.started is not None and "seconds" not in self.result:
            self._stop(trainer, module)
        self.counter.close()
        del module.contrastive_loss  # the class's method again

    def _stop(self, trainer, module) -> None:
        seconds = self._now(module) - self.started
        self.in_window = False
        steps = trainer.global_step - self.warmup
        flops, sentence_tokens, bias_tokens = self.counter.totals()
        self.result.update(
            steps=steps, seconds=seconds, step_seconds_mean=seconds / steps,
            step_cpu_seconds_mean=(time.process_time() - self.cpu_started) / steps, steps_per_s=steps / seconds,
            examples_per_s=self.examples / seconds,
            sentences_per_s=_sentences_per_example(module) * self.examples / seconds,
            real_tokens_per_s=sentence_tokens / seconds, bias_tokens_per_step=bias_tokens / steps,
            model_flops_per_step=flops / steps, achieved_tflops=flops / seconds / 1e12, **peak_memory(module.device))


def _examples(batch) -> int:
    """Training examples in a batch: rows of a pre-tokenized batch, sentences or triplets of a raw one."""
    return int(batch["ids"].shape[0]) if isinstance(batch, dict) else len(batch)


def run_loop(overrides: list[str], steps: int, warmup: int, device: torch.device) -> dict:
    """The real loop (see the module docstring), on `device`."""
    from bench.loop import train_with

    placement = ["trainer.accelerator=cpu"] if device.type == "cpu" else [
        "trainer.accelerator=gpu", f"trainer.devices=[{device.index or 0}]"]
    timer = LoopTimer(steps, warmup)
    with tempfile.TemporaryDirectory(prefix="train-throughput-") as work:
        # one step more than timed: the window ends where step `warmup + steps` starts, before the end of training
        trainer = train_with([*overrides, *placement], timer, Path(work), warmup + steps + 1)
    if "seconds" not in timer.result:
        raise UserError(f"the loop ran {trainer.global_step} steps, fewer than --warmup {warmup} + 1 (an epoch too "
                        "short for the batch size?)")
    return timer.result


def _sentences_per_example(module) -> int:
    """Sentences a training example holds: NLI triplets 3, unsupervised examples 1 (encoded in two views)."""
    return 3 if type(module).__name__ == "PromptBERTSup" else 1


#: What the headline figures are taken from: the loop's when it ran.
HEADLINE = ("steps_per_s", "step_seconds_mean", "step_cpu_seconds_mean", "examples_per_s", "sentences_per_s",
            "real_tokens_per_s", "bias_tokens_per_step", "model_flops_per_step", "achieved_tflops")


def resolve_device(requested: str) -> torch.device:
    """`--device`: auto = CUDA when there is one; a CUDA device on a machine without one is refused in one line."""
    if requested == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(requested)
    except RuntimeError:
        raise ConfigError(f"--device {requested}: not a device; use auto, cpu or cuda[:i]") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"--device {requested}: this machine has no CUDA device; use --device cpu (or auto)")
    if device.type not in ("cpu", "cuda"):
        raise ConfigError(f"--device {requested}: the benchmark runs on cpu or cuda")
    return device


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=("both", "loop", "phases"), default="both",
                        help="loop: the real train.py loop, no synchronisation inside; phases: the step written out, "
                             "each phase timed; both (default)")
    parser.add_argument("--steps", type=int, default=10, help="timed steps (after --warmup untimed ones)")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--device", default="auto", help="auto (cuda when available), cpu or cuda[:i]")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--peak-tflops", type=float, default=None,
                        help="the device's peak dense TFLOP/s at the run's precision, for MFU (e.g. H100 SXM bf16 989)")
    parser.add_argument("--random-bert", default=None, metavar="LAYERS:HIDDEN",
                        help="train a random BERT of this shape (12 heads) instead of backbone.name_or_path")
    parser.add_argument("--out", type=Path, default=None, help="write the result as JSON here")
    parser.add_argument("--data-only", type=int, default=None, metavar="N",
                        help="time only the data path (loader wait + input tensors, no model step) over N batches")
    args, overrides = parser.parse_known_args(argv)
    unknown = [o for o in overrides if o.startswith("--")]
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    if args.steps < 1 or args.warmup < 1:
        parser.error("--steps and --warmup must be at least 1 (the first step creates the optimiser's state)")
    if args.threads:
        torch.set_num_threads(args.threads)
    from bench.loop import check_overrides

    try:
        check_overrides(overrides)
    except UserError as err:
        sys.exit(f"error: {err}")
    with tempfile.TemporaryDirectory(prefix="train-throughput-model-") as scratch:
        if args.random_bert:
            from bench.step_counts import parse_random_bert, save_random_bert

            layers, hidden = parse_random_bert(args.random_bert, parser)
            overrides = [f"backbone.name_or_path={save_random_bert(Path(scratch), layers, hidden)}", *overrides]
        measure(args, overrides)


def measure(args, overrides: list[str]) -> None:
    try:
        device = resolve_device(args.device)
        cfg = compose_train(overrides)
        if args.data_only:
            result = data_path(cfg, args.data_only, device)
            print(f"data path: {result['data_path_ms']:.2f} ms per batch (loader wait {result['data_wait_ms']:.2f} ms, "
                  f"input tensors {result['inputs_ms']:.2f} ms) over {args.data_only} batches")
            if args.out:
                atomic_write_json(args.out, {**result, "overrides": overrides})
            return
        result = {"steps": args.steps}
        if args.mode in ("both", "phases"):
            result["phases"] = run(cfg, args.steps, args.warmup, device)
        if args.mode in ("both", "loop"):
            result["loop"] = run_loop(overrides, args.steps, args.warmup, device)
    except UserError as err:
        sys.exit(f"error: {err}")
    headline = result.get("loop") or result["phases"]
    result.update({key: headline[key] for key in HEADLINE},
                  **{key: value for key, value in headline.items() if key.startswith("peak_")},
                  measured_by="loop" if "loop" in result else "phases")
    if args.peak_tflops:
        result["peak_tflops"] = args.peak_tflops
        for part in (result, result.get("loop"), result.get("phases")):
            if part is not None:
                part["mfu"] = part["achieved_tflops"] / args.peak_tflops
    result["setup"] = {
        "overrides": overrides, "model": str(cfg.model.model_name_or_path), "batch_size": int(cfg.data.batch_size),
        "precision": str(cfg.trainer.precision), "compile": bool(cfg.trainer.get("compile")),
        "grad_cache_chunk_size": cfg.model.get("grad_cache_chunk_size"),
        "gradient_checkpointing": bool(cfg.model.get("gradient_checkpointing", False)),
        "pretokenize": bool(cfg.data.get("pretokenize", False)), "num_workers": cfg.data.get("num_workers"),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
    }
    print(format_result(result))
    if args.out:
        atomic_write_json(args.out, result)


def format_result(result: dict) -> str:
    setup = result["setup"]
    lines = [f"{setup['model']}  batch {setup['batch_size']}  {setup['precision']}  compile {setup['compile']}  "
             f"grad_cache {setup['grad_cache_chunk_size']}  checkpointing {setup['gradient_checkpointing']}  "
             f"pretokenize {setup['pretokenize']}  on {setup['device']}"]
    memory = ", ".join(f"{k} {v:.2f}" for k, v in result.items() if k.startswith("peak_") and k.endswith("gib"))
    for name in ("loop", "phases"):
        part = result.get(name)
        if part is None:
            continue
        label = ("loop (train.py's, no synchronisation inside)" if name == "loop"
                 else "phases (step written out, synchronised at every phase)")
        lines.append(f"{label}: step {part['step_seconds_mean']:.3f} s "
                     f"(CPU time {part['step_cpu_seconds_mean']:.3f} s)  {part['steps_per_s']:.3f} steps/s  "
                     f"{part['sentences_per_s']:.1f} sentences/s  "
                     f"{part['real_tokens_per_s']:.0f} real tokens/s  {part['achieved_tflops']:.4f} TFLOP/s"
                     + (f"  MFU {100 * part['mfu']:.2f}%" if "mfu" in part else "")
                     + (f"  (warm-up incl. compilation {part['warmup_seconds']:.1f} s)" if "warmup_seconds" in part
                        else ""))
        if name == "phases":
            fractions = "  ".join(f"{p} {100 * f:.1f}%" for p, f in part["phase_fraction"].items())
            lines.append(f"  phases: {fractions}  (data wait + inputs {100 * part['data_fraction']:.2f}%)")
    lines.append(f"peak memory: {memory}")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
