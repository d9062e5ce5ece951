"""``--convert aoti``: torch.export with a dynamic batch dimension, then AOTInductor.

The exported program is compiled ahead of time by ``torch._inductor.aoti_compile_and_package``
into a ``.pt2`` package (a shared library plus its weights) with freezing on (weights folded
into the compiled graph as constants, as torch.jit.freeze does for TorchScript). The worker loads
it with ``torch._inductor.aoti_load_package`` (handlers.runtime.loading); so does the parity check.

The batch dimension is dynamic from 1 to ``MAX_BATCH`` rows. The compiled kernels do not refuse
a larger batch, but nothing guarantees them past the bound the compiler was given, so the
loader (handlers.runtime.loading.AotiModel) runs a larger batch in chunks of ``MAX_BATCH`` rows.

Devices: CPU always (a C++ compiler is needed at packing time, never at serving time); CUDA
with ``--device cuda`` on a machine with a GPU. A package is compiled for one device type: the
loader refuses a CUDA package on a CPU worker.

Precisions: fp32, fp16, bf16 (the model is cast and exported on half inputs, as
``--convert export`` does) and int8-dynamic (plain int8 tensors and ``torch._int_mm``, which
Inductor compiles on CPU; on CUDA ``_int_mm`` needs sizes that are multiples of 8).
"""

from __future__ import annotations

import copy
import shutil
from pathlib import Path

import torch
from torch import nn

from torchbay.archiver.convert import export_failure, export_silenced, positional, quiet
from torchbay.archiver.errors import ArchiveArgumentError, ConversionError

# also handlers/runtime/aoti_loader.py's AOTI_MAX_BATCH (the worker does not import the archiver)
MAX_BATCH = 1024
DEVICES = ("cpu", "cuda")


def check_device(device: str) -> None:
    """ArchiveArgumentError for an unknown device or ``cuda`` on a host without a GPU."""
    if device not in DEVICES:
        raise ArchiveArgumentError(f"--device must be one of {DEVICES}, not {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise ArchiveArgumentError(
            "--device cuda: this host has no usable CUDA GPU (torch.cuda.is_available() is "
            "False); compile AOTInductor packages for CUDA on a machine with the target GPU, or "
            "use --device cpu"
        )


def _compiler_missing() -> str | None:
    """The reason no C++ compiler can be run, or None."""
    from torch._inductor import cpp_builder

    try:
        compiler = cpp_builder.get_cpp_compiler()
    except Exception as exc:  # torch raises RuntimeError / FileNotFoundError here
        return _one_line(exc)
    if shutil.which(compiler) is None and not Path(compiler).is_file():
        return f"C++ compiler {compiler!r} not found (set CXX or install g++/clang++)"
    return None


def compile_package(
    model: nn.Module,
    example: torch.Tensor | tuple[torch.Tensor, ...],
    path: Path,
    device: str = "cpu",
) -> torch.export.ExportedProgram:
    """Export ``model`` with a dynamic batch (1..MAX_BATCH) and compile it to ``path``.

    Returns the exported program (its dynamic dimensions go into the signature). Raises
    ConversionError naming the cause: export failure, no compiler, a failed compile.
    """
    check_device(device)
    missing = _compiler_missing()
    if missing is not None:
        raise ConversionError(f"--convert aoti needs a C++ compiler at packing time: {missing}")
    target = torch.device(device)
    if target.type != "cpu":  # keep the reference on the CPU for the parity check
        model = copy.deepcopy(model).to(target)
    model = model.eval()
    args = tuple(t.to(target) for t in positional(example))
    if args[0].shape[0] < 2:  # a batch of 1 would be specialized (0/1 specialization)
        args = tuple(torch.cat([t, t]) for t in args)
    batch = torch.export.Dim("batch", min=1, max=MAX_BATCH)
    try:
        with torch.no_grad(), quiet(), export_silenced():
            program = torch.export.export(
                model, args, dynamic_shapes=tuple({0: batch} for _ in args)
            )
    except Exception as exc:
        raise ConversionError(f"--convert aoti: torch.export failed{export_failure(exc)}") from None
    try:
        with torch.no_grad(), quiet():
            torch._inductor.aoti_compile_and_package(
                program, package_path=str(path), inductor_configs={"freezing": True}
            )
    except Exception as exc:
        raise ConversionError(
            f"--convert aoti: AOTInductor compile failed ({type(exc).__name__}): {_one_line(exc)}"
        ) from None
    return program


def _one_line(exc: BaseException) -> str:
    lines = [ln for ln in str(exc).strip().splitlines() if ln.strip()]
    return lines[0][:400] if lines else type(exc).__name__
