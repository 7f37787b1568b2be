"""oneDNN linears for CPU inference: while a block runs (`LinearPacks.swapped_in`), every `nn.Linear` of an encoder is
replaced by one whose weight is packed into oneDNN's blocked layout and multiplied with oneDNN's kernel
(`torch.ops.mkldnn._linear_pointwise`, the kernel Inductor's freezing pass emits for CPU linears). On the AVX-512 CPU of
docs/benchmarks.md it runs ~10% more GFLOP/s than MKL's sgemm behind `nn.Linear`; the result is the same product,
equal to float rounding (at most 3e-6 of MiniLM's largest embedding entry, 7e-7 of its unit embeddings). The
original linears are put back when the block ends, so outside it the model stays an ordinary, trainable, movable,
savable model; the packed copies are kept for the next block while their weights are unchanged, and a weight that
changed in between (an optimiser step, `load_state_dict`) is packed again, so a model that trains between two
encodings is never encoded with stale weights. Inside the block a packed linear has no gradient: it refuses to run
where autograd records, and refuses to be moved, converted or saved.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator

import torch

from promptemb.common.errors import ConfigError

#: Rows a packed weight is laid out for: a batch of 64 sentences of ~16 tokens (any row count runs, this one fastest).
PACKING_ROWS = 1024


@functools.cache
def onednn_linears_work() -> bool:
    """Whether this torch build has oneDNN's packed linear and it computes `F.linear` (checked once on a tiny one)."""
    mkldnn = torch.ops.mkldnn
    if not torch.backends.mkldnn.is_available() or not hasattr(mkldnn, "_reorder_linear_weight"):
        return False
    generator = torch.Generator().manual_seed(0)
    x, weight, bias = (torch.randn(*shape, generator=generator) for shape in ((5, 16), (8, 16), (8,)))
    try:
        packed = mkldnn._linear_pointwise(x, mkldnn._reorder_linear_weight(weight, 5), bias, "none", [], "")
    except RuntimeError:
        return False
    return torch.allclose(packed, torch.nn.functional.linear(x, weight, bias), atol=1e-5)


class PackedLinear(torch.nn.Module):
    """`y = x W^T + b` with W packed for oneDNN; shares the original's bias and keeps its in/out sizes."""

    def __init__(self, linear: torch.nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        with torch.no_grad():
            packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), PACKING_ROWS)
        self.register_buffer("packed_weight", packed, persistent=False)
        self.bias = linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled():
            raise RuntimeError("a oneDNN-packed linear (onednn_linears) is for inference: it has no gradient; it "
                               "runs inside the encoder's encoding (torch.inference_mode()) only")
        return torch.ops.mkldnn._linear_pointwise(x, self.packed_weight, self.bias, "none", [], "")

    def _apply(self, fn, recurse=True):
        raise ConfigError("a transformer's oneDNN-packed linears (onednn_linears) stay on the CPU in float32 while "
                          "it encodes; move or convert the model before or after encoding")

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        raise ConfigError("a transformer's oneDNN-packed linears (onednn_linears) have no plain weights to save "
                          "while it encodes; save or hash the model before or after encoding")


def packable(module: torch.nn.Module) -> bool:
    """A plain float32 `nn.Linear` without hooks of its own (a hook would not follow the weight into the packed
    linear, so such a linear keeps MKL's product)."""
    return (type(module) is torch.nn.Linear and module.weight.dtype == torch.float32
            and not (module._forward_hooks or module._forward_pre_hooks))


class LinearPacks:
    """The oneDNN-packed copies of `model`'s packable linears (only where `onednn_linears_work()`): made at the first
    block, kept while each weight is the same tensor with the same storage and version counter. Every in-place change
    through the tensor (an optimiser step, `load_state_dict`, `copy_` under `no_grad`) moves its version counter, so
    it is packed again at the next block; a write through `.data`, which no counter sees, is not noticed: encode a
    model changed that way with a new encoder. Costs one more copy of the linears' weights."""

    def __init__(self, model: torch.nn.Module):
        self.model = model
        #: id(linear) -> (the linear, the state of its weight and bias when packed, its packed copy)
        self.packs: dict[int, tuple[torch.nn.Linear, tuple, PackedLinear]] = {}

    @contextlib.contextmanager
    def swapped_in(self) -> Iterator[int]:
        """Every packable linear inside the model replaced by its packed copy for the block (packed now if it changed
        since), the original modules (the same objects, with their parameters) put back on exit; yields how many."""
        replaced = []
        try:
            for module in list(self.model.modules()):
                for name, child in list(module.named_children()):
                    if packable(child):
                        setattr(module, name, self.packed(child))
                        replaced.append((module, name, child))
            yield len(replaced)
        finally:
            for module, name, child in reversed(replaced):
                setattr(module, name, child)

    def packed(self, linear: torch.nn.Linear) -> PackedLinear:
        weight = linear.weight
        # an inference tensor has no version counter: packed at every block
        version = None if weight.is_inference() else weight._version
        state = (id(weight), weight.data_ptr(), version, id(linear.bias))
        kept = self.packs.get(id(linear))
        if kept is None or kept[0] is not linear or kept[1] != state or version is None:
            kept = (linear, state, PackedLinear(linear))
            self.packs[id(linear)] = kept
        return kept[2]
