"""oneDNN linears for CPU inference: every `nn.Linear` of a frozen encoder replaced by one whose weight is packed once
into oneDNN's blocked layout and multiplied with oneDNN's kernel (`torch.ops.mkldnn._linear_pointwise`, the kernel
Inductor's freezing pass emits for CPU linears). On the AVX-512 CPU of docs/benchmarks.md it runs ~10% more
GFLOP/s than MKL's sgemm behind `nn.Linear`; the result is the same product, equal to float rounding (~2e-6 on
MiniLM's unit embeddings). Inference only, on the CPU, in float32: the packed copy does not follow later changes
to the weight and has no gradient, so a packed linear refuses to run where autograd records, and refuses to be
moved, converted or saved (the weight is an opaque oneDNN tensor, absent from the state dict): load the model again
without packing for any of that.
"""

from __future__ import annotations

import functools

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
            raise RuntimeError("a oneDNN-packed linear (onednn_linears) is for inference: it has no gradient; run "
                               "it under torch.inference_mode() or load the model without packing to train it")
        return torch.ops.mkldnn._linear_pointwise(x, self.packed_weight, self.bias, "none", [], "")

    def _apply(self, fn, recurse=True):
        raise ConfigError("a transformer with oneDNN-packed linears (onednn_linears=true) stays on the CPU in "
                          "float32; load it again without onednn_linears to move or convert it")

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        raise ConfigError("a transformer with oneDNN-packed linears (onednn_linears=true) has no plain weights to "
                          "save; load it again without onednn_linears to save or hash it")


def pack_linears(model: torch.nn.Module, where: str) -> int:
    """Replace every float32 `nn.Linear` inside `model` by a `PackedLinear`, in place; returns how many. `where` names
    the setting in the refusal when this torch build cannot."""
    if not onednn_linears_work():
        raise ConfigError(f"{where}=true but this torch build has no working oneDNN packed linear "
                          "(torch.backends.mkldnn); drop it")
    replaced = 0
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if type(child) is torch.nn.Linear and child.weight.dtype == torch.float32:
                setattr(module, name, PackedLinear(child))
                replaced += 1
    return replaced
