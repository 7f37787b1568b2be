"""Gradient caching (Gao et al. 2021, "Scaling Deep Contrastive Learning Batch Size under Memory Limited Setup").

InfoNCE couples every row of the batch, so its batch cannot simply be split into accumulation steps. Gradient
caching gets the exact full-batch gradient with the activation memory of one chunk:

1. pass 1: embed the batch chunk by chunk without a graph (and without autocast's weight cache, which a no-grad
   forward must not seed), saving the RNG state before each chunk;
2. compute the full-batch InfoNCE on those embeddings (DDP: gathered over ranks as usual) and its gradient
   d loss / d embedding, which needs no encoder graph;
3. pass 2: re-run each chunk with a graph, replaying its saved RNG state so dropout draws the same masks, and
   back-propagate the cached gradient of its rows into the parameters.

Pass 1 keeps the graph of its last chunk, and pass 2 back-propagates that one first instead of re-running it (so
at most one chunk's activations are alive at any time): the extra forward covers every chunk but the last, and a
single chunk costs what the plain step costs.

Template-denoising biases: in pass 1 each (call, view, sentence length) bias is computed once for the whole step
(a bias forward per chunk covering only the lengths not seen before), and its graph is kept — template-only rows,
a fraction of one chunk's activations — while the chunks read the biases as gradient-collecting leaves in both
passes; after pass 2 each bias graph is back-propagated once with the gradient the chunks put on its rows. So the
biases are computed as often as in a full-batch step, never per chunk and never twice.

The parameter gradients are handed to Lightning's automatic optimisation as a surrogate loss, linear in the
parameters, whose value is the loss and whose gradient is exactly the accumulated full-batch gradient: Lightning's
backward (with AMP loss scaling and gradient accumulation), DDP's gradient all-reduce (one backward, every
parameter once), gradient clipping, the optimiser and LR-schedule steps all run unchanged.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import torch

from promptemb.common.errors import ConfigError

BiasCompute = Callable[[list, list[torch.Tensor]], list[dict[int, torch.Tensor]]]
BiasStates = list[dict[int, torch.Tensor]]  # per view: layer -> [rows, D]


@dataclass
class RngState:
    """The generator states dropout draws from: the CPU one and, on an accelerator, that device's."""

    cpu: torch.Tensor
    device: torch.device
    accelerator: torch.Tensor | None

    @classmethod
    def capture(cls, device: torch.device) -> RngState:
        accelerator = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
        return cls(torch.get_rng_state(), device, accelerator)

    def restore(self) -> None:
        torch.set_rng_state(self.cpu)
        if self.accelerator is not None:
            torch.cuda.set_rng_state(self.accelerator, self.device)


@contextlib.contextmanager
def autocast_weight_cache_disabled() -> Iterator[None]:
    """Autocast without its weight cache, for pass 1's no-grad chunks. Autocast keeps the low-precision copy of each
    fp32 weight for the whole region (Lightning's, around the training step); on torch releases before
    pytorch#165068 a copy first made under no_grad was cached without gradient history and reused by the
    grad-enabled forwards that follow (pass 1's last chunk, pass 2), so most parameters silently got no gradient
    (pytorch#112583). Outside autocast this changes nothing."""
    enabled = torch.is_autocast_cache_enabled()
    torch.set_autocast_cache_enabled(False)
    try:
        yield
    finally:
        torch.set_autocast_cache_enabled(enabled)


#: Lightning precisions that train with a GradScaler (fp16 mixed precision).
SCALED_PRECISIONS = ("16-mixed", "16", 16)


def check_grad_cache_precision(precision, chunk_size: int | None) -> None:
    """Gradient caching back-propagates each chunk's cached embedding gradient itself, in pass 2: fp16 activations
    would carry gradients the GradScaler never scaled (small ones underflow to zero). Refused; bf16 needs no scaler."""
    if chunk_size and precision in SCALED_PRECISIONS:
        raise ConfigError(f"trainer.precision={precision} cannot train with model.grad_cache_chunk_size={chunk_size}: "
                          "pass 2 of gradient caching back-propagates gradients fp16's GradScaler never scales; "
                          "use trainer.precision=bf16-mixed (or 32-true)")


def split_batch(batch, size: int) -> list:
    """Split a training batch along its example axis: a sequence of examples (sentences, triplets), a tensor, or a
    mapping of such (every value split the same way)."""
    if isinstance(batch, torch.Tensor):
        return list(batch.split(size))
    if isinstance(batch, Mapping):
        parts = {key: split_batch(value, size) for key, value in batch.items()}
        return [dict(zip(parts, values, strict=True)) for values in zip(*parts.values(), strict=True)]
    if isinstance(batch, Sequence):
        return [batch[start : start + size] for start in range(0, len(batch), size)]
    raise TypeError(f"gradient caching cannot split a batch of type {type(batch).__name__}")


@dataclass
class _BiasForward:
    """One pass-1 bias forward: the lengths it covered, its outputs (with their graph) and the leaves the chunks read
    in their place (the outputs themselves under `keep_graph`)."""

    lengths: list[torch.Tensor]
    outputs: BiasStates
    leaves: BiasStates


@dataclass
class TemplateBiasCache:
    """Template biases of one step, each (pooled_views call, view, sentence length) computed once however the batch
    is chunked. `record` (pass 1) computes the missing lengths; `replay` (pass 2) reads the cached leaves.
    `keep_graph` records the biases with their graph instead of as leaves: pass 1 with plain autograd, the
    computation whose gradient gradient caching reproduces (what the tests compare it with)."""

    device: torch.device
    keep_graph: bool = False
    replaying: bool = False
    forwards: list[_BiasForward] = field(default_factory=list)
    rows: dict[tuple[int, int, int], tuple[int, int, int]] = field(default_factory=dict)  # key -> forward, view, row
    rng_after_call: list[list[RngState]] = field(default_factory=list)  # per chunk, per call
    _chunk: int = -1
    _call: int = 0

    def start_chunk(self, index: int) -> None:
        self._chunk, self._call = index, 0
        if not self.replaying:
            self.rng_after_call.append([])

    def biases(self, compute: BiasCompute, builders: list,
               lengths: list[torch.Tensor]) -> list[dict[int, torch.Tensor]]:
        """Each view's biases, row by row (`lengths`: each view's sentence lengths, in host memory)."""
        call = self._call
        self._call += 1
        if not self.replaying:
            self._compute_missing(compute, call, builders, lengths)
            self.rng_after_call[self._chunk].append(RngState.capture(self.device))
        else:  # the RNG as pass 1 left it after this call's bias forward, which pass 2 does not run
            self.rng_after_call[self._chunk][call].restore()
        results = []
        for view, view_lengths in enumerate(lengths):
            sources = [self.rows[(call, view, n)] for n in view_lengths.tolist()]
            # one gather per layer from the leaves this view's rows come from, whatever the number of rows
            parts = sorted({(f, v) for f, v, _ in sources})
            offsets, start = {}, 0
            for f, v in parts:
                offsets[(f, v)] = start
                start += len(self.forwards[f].lengths[v])
            index = torch.tensor([offsets[(f, v)] + r for f, v, r in sources]).to(self.device, non_blocking=True)
            layers = self.forwards[parts[0][0]].leaves[parts[0][1]]
            results.append({layer: torch.cat([self.forwards[f].leaves[v][layer] for f, v in parts])[index]
                            for layer in layers})
        return results

    def _compute_missing(self, compute: BiasCompute, call: int, builders: list, lengths: list[torch.Tensor]) -> None:
        views, missing = [], []
        for view, view_lengths in enumerate(lengths):
            new = sorted({n for n in view_lengths.tolist() if (call, view, n) not in self.rows})
            if new:
                views.append(view)
                missing.append(torch.tensor(new))  # in host memory: `template_biases` moves what it needs
        if not views:
            return
        with torch.enable_grad():  # pass 1 runs without grad, but the bias graph is back-propagated after pass 2
            outputs = compute([builders[v] for v in views], missing)
        leaves = outputs if self.keep_graph else [
            {layer: states.detach().requires_grad_(states.requires_grad) for layer, states in out.items()}
            for out in outputs]
        index = len(self.forwards)
        self.forwards.append(_BiasForward(missing, outputs, leaves))
        for position, (view, new) in enumerate(zip(views, missing, strict=True)):
            for row, n in enumerate(new.tolist()):
                self.rows[(call, view, n)] = (index, position, row)

    def leaves(self) -> list[torch.Tensor]:
        return [leaf for forward in self.forwards for out in forward.leaves for leaf in out.values()]


class GradCache:
    """One training step with gradient caching; `loss` runs pass 1, `surrogate` pass 2 (see the module docstring).

    The module provides `training_views(chunk)` -> (anchors, positives, hard negatives or None), the loss of
    those views (`contrastive_objective`, InfoNCE, its Matryoshka sum or its sum over layers) and a
    `template_bias_cache` attribute: while it is set, the module's template biases come from
    `TemplateBiasCache.biases(compute, builders, lengths)`.
    """

    def __init__(self, module, chunk_size: int):
        if chunk_size < 1:
            raise ValueError(f"grad_cache_chunk_size must be >= 1, got {chunk_size}")
        self.module, self.chunk_size = module, chunk_size
        self.params = [p for p in module.parameters() if p.requires_grad]

    def loss(self, batch) -> tuple[torch.Tensor, int]:
        """Pass 1 and the full-batch InfoNCE (its graph reaches only the cached embeddings); (loss, rows)."""
        module = self.module
        self.chunks = split_batch(batch, self.chunk_size)
        self.cache = TemplateBiasCache(module.device)
        self.chunk_rng: list[RngState] = []
        views = []
        module.template_bias_cache = self.cache
        try:
            with torch.no_grad():
                for index, chunk in enumerate(self.chunks):
                    self.chunk_rng.append(RngState.capture(module.device))
                    self.cache.start_chunk(index)
                    last = index == len(self.chunks) - 1
                    with torch.enable_grad() if last else autocast_weight_cache_disabled():
                        views.append(module.training_views(chunk))
        finally:
            module.template_bias_cache = None
        self.rng_after_pass1 = RngState.capture(module.device)
        self.last_chunk_views = [v for v in views[-1] if v is not None]  # with its graph
        self.embeddings = [[None if v is None else v.detach().requires_grad_() for v in chunk] for chunk in views]
        anchors, positives, negatives = (
            None if column[0] is None else torch.cat(column) for column in zip(*self.embeddings, strict=True)
        )
        return module.contrastive_objective(anchors, positives, negatives), anchors.shape[0]

    def surrogate(self, loss: torch.Tensor) -> torch.Tensor:
        """Pass 2: a tensor equal to `loss` whose gradient w.r.t. the parameters is d loss / d parameters."""
        cached = [[e for e in chunk if e is not None] for chunk in self.embeddings]
        flat_grads = iter(torch.autograd.grad(loss, [e for chunk in cached for e in chunk]))
        embedding_grads = [[next(flat_grads) for _ in chunk] for chunk in cached]
        grads = [torch.zeros_like(p) for p in self.params]
        leaves = [leaf for leaf in self.cache.leaves() if leaf.requires_grad]  # none with freeze_bias
        leaf_grads = [torch.zeros_like(leaf) for leaf in leaves]
        position = {id(leaf): index for index, leaf in enumerate(leaves)}
        _accumulate(grads + leaf_grads, self.last_chunk_views, self.params + leaves, embedding_grads[-1])
        self.last_chunk_views = None
        module = self.module
        module.template_bias_cache = self.cache
        self.cache.replaying = True
        try:
            for index in range(len(self.chunks) - 1):
                self.chunk_rng[index].restore()
                self.cache.start_chunk(index)
                views = [v for v, e in zip(module.training_views(self.chunks[index]), self.embeddings[index],
                                           strict=True) if e is not None]
                _accumulate(grads + leaf_grads, views, self.params + leaves, embedding_grads[index])
        finally:
            module.template_bias_cache = None
        pairs = [(out[layer], leaf_grads[position[id(leaf)]])  # the bias graphs, with the gradient their rows got
                 for forward in self.cache.forwards
                 for out, out_leaves in zip(forward.outputs, forward.leaves, strict=True)
                 for layer, leaf in out_leaves.items() if id(leaf) in position]
        if pairs:
            _accumulate(grads, [o for o, _ in pairs], self.params, [g for _, g in pairs])
        self.rng_after_pass1.restore()
        linear = sum((p * g).sum() for p, g in zip(self.params, grads, strict=True))
        return loss.detach() + (linear - linear.detach())


def _accumulate(totals: list[torch.Tensor], outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                output_grads: list[torch.Tensor]) -> None:
    """totals[i] += d <outputs, output_grads> / d inputs[i] (inputs the outputs do not reach add nothing)."""
    got = torch.autograd.grad(outputs, inputs, output_grads, allow_unused=True)
    pairs = [(total, grad) for total, grad in zip(totals, got, strict=True) if grad is not None]
    if pairs:
        torch._foreach_add_([total for total, _ in pairs], [grad for _, grad in pairs])
