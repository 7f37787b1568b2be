"""Whether torch.compile can run here: asked by the trainer (`trainer.compile`) and the encoder
(`backbone.compile`)."""

from __future__ import annotations

import shutil

from promptemb.common.device_profile import accelerator_kind
from promptemb.common.errors import ConfigError


def compile_problem(accelerator: str | None) -> str | None:
    """Why torch.compile cannot run here for this accelerator (None when it can): TorchDynamo unsupported on this
    Python, no C++ compiler for Inductor's CPU kernels, or no Triton for its CUDA kernels."""
    import torch._dynamo
    from torch._inductor import config as inductor_config

    if not torch._dynamo.is_dynamo_supported():
        return "TorchDynamo does not support this Python/platform"
    # a CUDA accelerator without CUDA is a rehearsal on the CPU (common/device_profile.py): Inductor's CPU kernels
    on_cuda = accelerator_kind(accelerator) == "cuda" and torch.cuda.is_available()
    if on_cuda:
        from torch.utils._triton import has_triton

        return None if has_triton() else "Triton is not installed (Inductor's CUDA kernels need it)"
    compilers = inductor_config.cpp.cxx if isinstance(inductor_config.cpp.cxx, list | tuple) else (
        inductor_config.cpp.cxx,)
    if not any(name and shutil.which(name) for name in compilers):
        return f"no C++ compiler for Inductor's CPU kernels (looked for {', '.join(map(str, filter(None, compilers)))})"
    return None


def check_compile_works(key: str, accelerator: str | None) -> None:
    """`key=true` (trainer.compile, backbone.compile) refused in one line where torch.compile cannot run."""
    if problem := compile_problem(accelerator):
        raise ConfigError(f"{key}=true cannot work on this machine: {problem}; use {key}=false")
