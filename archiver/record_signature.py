"""The example input of ``torchbay archive`` and the tensor signature recorded from it (imports
torch; only ``archiver/build.py`` imports this, inside ``package``).

``--example-input`` holds, batch dimension first in every tensor:

* one tensor (``torch.save`` or ``.npy``): one input named ``input0``;
* a tuple or list of tensors (``torch.save``): the model's positional inputs, named ``input0``,
  ``input1``, ...;
* a dict of tensors (``torch.save``, or an ``.npz``): the inputs by name. When every key is a
  parameter of the model's ``forward``, the inputs take the forward's order; otherwise the dict's
  order is the positional order. The names are what OIP clients send.

Outputs come from a run of the packed model, loaded as the worker loads it: a tensor is
``output0``, a tuple or list ``output0``, ``output1``, ..., a dict of tensors its keys. Shapes
carry ``-1`` for the batch dimension, and for every dimension an exported program declares
dynamic. Datatypes are the tensors' own: an fp16 (bf16) model's are FP16 (BF16), its floating
inputs declared in its dtype by ``build`` and its outputs as the packed model returns them.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from torchbay.archiver.convert import file_problem, quiet
from torchbay.archiver.errors import ArchiveArgumentError, ConversionError
from torchbay.archiver.signature import TORCH_TO_OIP, TensorSpec

EXAMPLE_NPY = "example_input.npy"  # one input (also what older readers know)
EXAMPLE_NPZ = "example_input.npz"  # several inputs, by name


@dataclass(frozen=True)
class Example:
    """The model's inputs in positional order, each with its OIP name."""

    names: tuple[str, ...]
    tensors: tuple[torch.Tensor, ...]

    @property
    def batch(self) -> int:
        return int(self.tensors[0].shape[0])

    @property
    def first(self) -> torch.Tensor:
        return self.tensors[0]

    def map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> Example:
        return Example(self.names, tuple(fn(t) for t in self.tensors))

    def rows(self, n: int) -> Example:
        """The first ``n`` rows, repeating the example when it has fewer."""
        return self.map(lambda t: torch.cat([t] * (n // t.shape[0] + 1))[:n])


def forward_names(model: Any) -> list[str] | None:
    """The names of the model's forward parameters (eager or TorchScript), or None."""
    try:
        if isinstance(model, torch.jit.ScriptModule):
            return [a.name for a in model.forward.schema.arguments[1:]]
        params = inspect.signature(model.forward).parameters.values()
        return [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (AttributeError, TypeError, ValueError, RuntimeError):
        return None


def load_example(path: Path, model: Any) -> Example:
    """The example input file as an Example (see the module docstring)."""
    if not path.is_file():
        raise ArchiveArgumentError(f"example input {str(path)!r} does not exist")
    try:
        if path.suffix == ".npy":
            data: Any = torch.from_numpy(np.load(path, allow_pickle=False))
        elif path.suffix == ".npz":
            with np.load(path, allow_pickle=False) as npz:
                data = {k: torch.from_numpy(npz[k]) for k in npz.files}
        else:
            with quiet():  # a quantized tensor's deprecation
                data = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # numpy/torch raise many types for a bad file
        raise ArchiveArgumentError(
            f"cannot read example input {path.name!r}: {file_problem(path, exc)}"
        ) from None
    if isinstance(data, torch.Tensor):
        names, tensors = ["input0"], [data]
    elif isinstance(data, tuple | list) and data:
        names, tensors = [f"input{i}" for i in range(len(data))], list(data)
    elif isinstance(data, dict) and data:
        if not all(isinstance(k, str) and k for k in data):  # they are the inputs' OIP names
            raise ArchiveArgumentError(
                f"example input {path.name!r}: a dict's keys name the inputs and must be "
                f"non-empty strings, got {list(data)!r}"[:300]
            )
        names = list(data)
        order = forward_names(model)
        if order and set(names) <= set(order):
            names = sorted(names, key=order.index)
        tensors = [data[k] for k in names]
    else:
        raise ArchiveArgumentError(
            f"example input {path.name!r} must hold a tensor, a tuple or a dict of tensors, "
            f"got {type(data).__name__}"
        )
    checked = (_checked(path.name, n, t) for n, t in zip(names, tensors, strict=True))
    return Example(tuple(names), tuple(checked))


def _checked(file: str, name: str, tensor: Any) -> torch.Tensor:
    if not isinstance(tensor, torch.Tensor):
        raise ArchiveArgumentError(
            f"example input {file!r}: {name} must be a tensor, got {type(tensor).__name__}"
        )
    if tensor.layout != torch.strided or tensor.is_quantized:
        kind, way = ("quantized", "dequantize") if tensor.is_quantized else ("sparse", "to_dense")
        raise ArchiveArgumentError(
            f"example input {file!r}: {name} must be a dense tensor, got a {kind} one "
            f"(save its .{way}())"
        )
    tensor = tensor.detach()  # saved from a computation with autograd (numpy() refuses it)
    if tensor.dim() < 1 or tensor.shape[0] < 1:
        raise ArchiveArgumentError(
            f"example input {file!r}: {name} needs a batch dimension first "
            f"(shape {list(tensor.shape)})"
        )
    if tensor.is_floating_point():
        tensor = tensor.float()
    return tensor.contiguous()


def check_batches(example: Example) -> None:
    sizes = {int(t.shape[0]) for t in example.tensors}
    if len(sizes) > 1:
        shapes = {n: list(t.shape) for n, t in zip(example.names, example.tensors, strict=True)}
        raise ArchiveArgumentError(
            f"every example input needs the same batch size (first dimension); got {shapes}"
        )


def save_example(example: Example, directory: Path) -> tuple[str, Path]:
    """(archive name, path) of the example written for the archive: .npy for one input, a
    named .npz for several."""
    directory.mkdir(parents=True, exist_ok=True)
    if len(example.tensors) == 1:
        path = directory / EXAMPLE_NPY
        np.save(path, example.first.numpy(), allow_pickle=False)
        return EXAMPLE_NPY, path
    path = directory / EXAMPLE_NPZ
    with path.open("wb") as f:
        np.savez(f, **{n: t.numpy() for n, t in zip(example.names, example.tensors, strict=True)})
    return EXAMPLE_NPZ, path


def _datatype(tensor: torch.Tensor) -> str:
    name = str(tensor.dtype).removeprefix("torch.")
    if name not in TORCH_TO_OIP:
        raise ConversionError(f"tensors of dtype {name} have no Open Inference Protocol datatype")
    return TORCH_TO_OIP[name]


def _spec(
    name: str, tensor: torch.Tensor, batch: int, dynamic: set[int], output: bool
) -> TensorSpec:
    shape = list(tensor.shape)
    if shape and shape[0] == batch:
        dynamic = dynamic | {0}
    dims = [-1 if i in dynamic else d for i, d in enumerate(shape)]
    return TensorSpec(name=name, datatype=_datatype(tensor), shape=dims)


def input_specs(example: Example, dynamic: list[set[int]] | None = None) -> list[TensorSpec]:
    dynamic = dynamic or [set() for _ in example.tensors]
    return [
        _spec(n, t, example.batch, d | {0}, output=False)
        for n, t, d in zip(example.names, example.tensors, dynamic, strict=True)
    ]


def output_specs(
    output: Any, batch: int, dynamic: list[set[int]] | None = None
) -> list[TensorSpec] | None:
    """The outputs' specs, or None when the output is not a tensor, sequence or dict of them."""
    if isinstance(output, torch.Tensor):
        named = [("output0", output)]
    elif isinstance(output, tuple | list):
        named = [(f"output{i}", t) for i, t in enumerate(output)]
    elif isinstance(output, dict):
        named = [(str(k), t) for k, t in output.items()]
    else:
        return None
    if not named or not all(isinstance(t, torch.Tensor) for _, t in named):
        return None
    if dynamic is None or len(dynamic) != len(named):
        dynamic = [set() for _ in named]
    return [_spec(n, t, batch, d, output=True) for (n, t), d in zip(named, dynamic, strict=True)]


def exported_dynamic_dims(program: Any) -> tuple[list[set[int]], list[set[int]]]:
    """(per user input, per output) the dimensions an exported program keeps symbolic."""

    def dims(node: Any) -> set[int]:
        val = getattr(node, "meta", {}).get("val")
        shape = getattr(val, "shape", ())
        return {i for i, d in enumerate(shape) if not isinstance(d, int)}

    graph = program.graph_module.graph
    user_inputs = set(program.graph_signature.user_inputs)
    inputs = [dims(n) for n in graph.nodes if n.op == "placeholder" and n.name in user_inputs]
    out_node = next(n for n in graph.nodes if n.op == "output")
    outs = out_node.args[0]
    outs = outs if isinstance(outs, tuple | list) else (outs,)
    return inputs, [dims(n) for n in outs]
