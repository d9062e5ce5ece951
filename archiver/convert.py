"""Model conversion for ``torchbay archive``: load the reference, apply a precision, serialize.

Imports torch; only ``package.package`` imports this (inside the call). Every failure a user can
cause raises ConversionError naming the layer or op, or ArchiveArgumentError for a bad input file.

Formats and what each precision can take:
  torchscript (trace/script, model.pt): fp32, fp16, bf16, int8-dynamic; ``optimize`` freezes and
      runs torch.jit.optimize_for_inference.
  exported (torch.export, model.pt2, dynamic batch dimension): fp32, fp16, bf16, int8-dynamic
      (the int8 layers are plain tensors and aten ops, so torch.export takes them).
  eager (model file + state dict): fp32, fp16, bf16, int8-dynamic (the loader quantizes the
      model's Linear layers the same way before loading the int8 state dict).
int8-dynamic is ``torchbay.handlers.runtime.int8``: Linear layers only, int8 weights per output
channel, activations quantized per row at run time, plain int8 tensors and ``torch._int_mm`` (no
``torch.ao.quantization``, which torch 2.13 deprecates together with its quantized dtypes).
TorchScript itself (torch.jit.trace/script/save/load) is deprecated in torch 2.13: torch.export
is the supported format, and the one the quickstart uses.
fp16/bf16 models take and return half precision, and the archive's signature declares it (FP16 or
BF16 for every floating input and output). TorchScript ones also take float32 input (the cast is
baked into the graph, so any handler can feed them); exported programs are specialized on the half
input dtype (the loader's ``model_input_dtype``). Archives packed before issue 28 hold TorchScript
that also casts the output back to float32, and declare FP32: the graph carries that code, so
they load and serve as before without the class that made it.
"""

from __future__ import annotations

import copy
import importlib.util
import inspect
import io
import logging
import re
import sys
import uuid
import warnings
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stderr
from pathlib import Path
from typing import Any

import torch
from torch import nn

from torchbay.archiver.errors import ArchiveArgumentError, ConversionError
from torchbay.handlers.runtime.exits import exits_refused

# The layer types int8-dynamic replaces (torchbay.handlers.runtime.int8), in every format.
QUANTIZABLE: tuple[type[nn.Module], ...] = (nn.Linear,)
EAGER_QUANTIZABLE = QUANTIZABLE
_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


@contextmanager
def quiet() -> Iterator[None]:
    """Silence torch's deprecation and tracer chatter during conversion (stderr stays readable).

    The batch-size and parity checks catch what a TracerWarning would have hinted at.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def import_model_class(model_file: Path) -> type[nn.Module]:
    """The single nn.Module class defined in ``model_file`` (TorchServe's rule)."""
    name = f"_torchbay_model_{uuid.uuid4().hex}"
    spec = importlib.util.spec_from_file_location(name, model_file)
    if spec is None or spec.loader is None:
        raise ArchiveArgumentError(f"cannot import model file {model_file.name!r}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickling look the module up by name
    try:
        with exits_refused():  # a file that calls sys.exit(): one error line, not an exit
            spec.loader.exec_module(module)
    except Exception as exc:
        hint = ""
        if isinstance(exc, ModuleNotFoundError):  # the worker finds only what the archive holds
            hint = " (a module of your own goes into the archive with --extra-files)"
        raise ArchiveArgumentError(f"importing {model_file.name!r} failed: {exc!r}{hint}") from None
    classes = [
        c
        for _, c in inspect.getmembers(module, inspect.isclass)
        if c.__module__ == name and issubclass(c, nn.Module)
    ]
    if len(classes) != 1:
        raise ArchiveArgumentError(
            f"{model_file.name!r} must define exactly one nn.Module class, found "
            f"{[c.__name__ for c in classes]}"
        )
    return classes[0]


def load_eager(model_file: Path, state_file: Path) -> nn.Module:
    """Instantiate the model file's class and load the state dict (weights_only) in eval mode."""
    cls = import_model_class(model_file)
    try:
        model = cls()
    except TypeError as exc:
        raise ArchiveArgumentError(
            f"model class {cls.__name__} must be constructible with no arguments: {exc}"
        ) from None
    try:
        state = torch.load(state_file, map_location="cpu", weights_only=True)
    except Exception as exc:
        problem = file_problem(state_file, exc)
        if "Weights only load failed" in str(exc):  # pickled objects: torch.save(model)?
            problem = (
                "it holds pickled objects, not only tensors (a whole model saved with "
                "torch.save(model)? save model.state_dict() instead)"
            )
        raise ArchiveArgumentError(
            f"cannot read state dict {state_file.name!r} (weights_only): {problem}"
        ) from None
    if isinstance(state, dict) and isinstance(state.get("state_dict"), dict):
        state = state["state_dict"]
    if not isinstance(state, dict):
        raise ArchiveArgumentError(f"{state_file.name!r} is not a state dict")
    try:
        model.load_state_dict(state)
    except RuntimeError as exc:
        raise ArchiveArgumentError(
            f"{state_file.name!r} does not fit {cls.__name__}: {str(exc).splitlines()[0]}"
        ) from None
    return model.eval()


def load_exported(path: Path) -> torch.export.ExportedProgram:
    try:
        with quiet(), export_silenced():  # torch logs the traceback of a file it cannot read
            return torch.export.load(str(path))
    except Exception as exc:
        raise ArchiveArgumentError(
            f"{path.name!r} is not a torch.export program: {_one_line(exc)}"
        ) from None


def load_torchscript(path: Path) -> torch.jit.ScriptModule:
    try:
        return torch.jit.load(str(path), map_location="cpu").eval()
    except Exception as exc:
        raise ArchiveArgumentError(
            f"{path.name!r} is not a TorchScript file: {file_problem(path, exc)}"
        ) from None


def quantizable_layers(model: nn.Module, types: tuple[type[nn.Module], ...]) -> list[str]:
    return [name for name, mod in model.named_modules() if isinstance(mod, types)]


def quantize_int8(model: nn.Module, types: tuple[type[nn.Module], ...]) -> nn.Module:
    """Dynamic int8 quantization of ``types`` layers; ConversionError when there are none."""
    if not quantizable_layers(model, types):
        kinds = "/".join(t.__name__ for t in types)
        layers = sorted({type(m).__name__ for m in model.modules() if not list(m.children())})
        raise ConversionError(
            f"int8-dynamic quantizes only {kinds} layers and this model has none "
            f"(its layers: {', '.join(layers) or 'none'}); use fp16 or bf16 instead"
        )
    from torchbay.handlers.runtime.int8 import quantize_linear

    return quantize_linear(copy.deepcopy(model)).eval()


def cast(model: nn.Module, precision: str) -> nn.Module:
    return copy.deepcopy(model).to(_DTYPES[precision]).eval()


class _HalfInput(nn.Module):
    """Floating inputs cast to the half dtype of an fp16 or bf16 model, whose output stays half
    (the datatype the archive declares). Which half dtype is a bool, not a dtype attribute, so
    that the wrapper stays scriptable."""

    def __init__(self, inner: nn.Module, bf16: bool) -> None:
        super().__init__()
        self.inner = inner
        self.bf16 = bf16

    # No return annotation: TorchScript takes the inner model's (a tensor, a tuple, a dict).
    def forward(self, x: torch.Tensor):
        if x.is_floating_point():
            x = x.to(torch.bfloat16) if self.bf16 else x.to(torch.float16)
        return self.inner(x)


def with_cast(model: nn.Module, precision: str) -> nn.Module:
    """Wrap a half-precision model so it also takes float32 input (floating inputs only)."""
    return _HalfInput(model, bf16=precision == "bf16").eval()


def positional(example: torch.Tensor | tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    """A model's positional inputs: one tensor, or a tuple of them (multi-input models)."""
    return example if isinstance(example, tuple) else (example,)


def locate_failure(
    model: nn.Module, example: torch.Tensor | tuple[torch.Tensor, ...], what: str
) -> None:
    """Run ``model`` eagerly; on failure raise ConversionError naming the innermost layer."""
    stack: list[str] = []
    failed: list[str] = []
    names = {id(m): n for n, m in model.named_modules()}

    def pre(mod: nn.Module, _args: Any) -> None:
        stack.append(names.get(id(mod), type(mod).__name__))

    def post(_mod: nn.Module, _args: Any, _out: Any) -> None:
        stack.pop()

    handles = [m.register_forward_pre_hook(pre) for m in model.modules()]
    handles += [m.register_forward_hook(post) for m in model.modules()]
    try:
        with torch.inference_mode(), quiet():
            model(*positional(example))
    except Exception as exc:
        failed = stack[-1:] or ["<model>"]
        layer = failed[0] or "<model>"
        kind = type(dict(model.named_modules()).get(layer, model)).__name__
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConversionError(
            f"{what} cannot take layer {layer!r} ({kind}): {first}", layer=layer
        ) from None
    finally:
        for h in handles:
            h.remove()


def trace(
    model: nn.Module, example: torch.Tensor | tuple[torch.Tensor, ...]
) -> torch.jit.ScriptModule:
    """torch.jit.trace, checked on other values of the example's shape (negated, doubled plus
    one): a trace keeps the path the example took, so a model whose path depends on its input's
    values (``if x.sum() > 0``) would serve that path for every request. The parity check runs
    the example's own rows and cannot see it."""
    args = positional(example)
    checks = [
        tuple(fn(t) if t.is_floating_point() else t for t in args)
        for fn in (torch.neg, lambda t: t * 2 + 1)
    ]
    if not any(t.is_floating_point() for t in args):
        checks = []
    try:
        with torch.no_grad(), quiet():
            return torch.jit.trace(
                model, args, check_trace=bool(checks), check_inputs=checks, check_tolerance=1e-4
            )
    except torch.jit.TracingCheckError:
        raise ConversionError(
            "torch.jit.trace keeps the example's path only, and the model takes another on "
            "other inputs (data-dependent control flow): use --convert torchscript-script or "
            "export, or none"
        ) from None
    except Exception:  # it fails on the other values themselves (or at all): unchecked
        pass
    try:
        with torch.no_grad(), quiet():
            return torch.jit.trace(model, args, check_trace=False)
    except Exception as exc:
        raise ConversionError(f"torch.jit.trace failed: {_one_line(exc)}") from None


def script(model: nn.Module) -> torch.jit.ScriptModule:
    try:
        with quiet():
            return torch.jit.script(model)
    except Exception as exc:
        raise ConversionError(
            f"torch.jit.script failed (try --convert torchscript-trace): {_one_line(exc)}"
        ) from None


def freeze(module: torch.jit.ScriptModule) -> torch.jit.ScriptModule:
    """torch.jit.freeze: inline weights as constants, fold conv/bn and constant subgraphs.

    optimize_for_inference is not applied here: it embeds MKLDNN tensors that torch.jit.save
    cannot serialize, so every loader runs it after loading (handlers.runtime.loading, which the
    parity check uses too).
    """
    try:
        with quiet():
            return torch.jit.freeze(module.eval())
    except Exception as exc:
        raise ConversionError(f"--optimize: torch.jit.freeze failed: {_one_line(exc)}") from None


def export(
    model: nn.Module, example: torch.Tensor | tuple[torch.Tensor, ...]
) -> torch.export.ExportedProgram:
    """torch.export with a dynamic batch dimension (shared by every input), in eval and no-grad
    mode."""
    args = positional(example)
    if args[0].shape[0] < 2:
        # A batch of 1 would be specialized (0/1 specialization); export with 2 rows instead.
        args = tuple(torch.cat([t, t]) for t in args)
    batch = torch.export.Dim("batch", min=1, max=1 << 16)
    try:
        with torch.no_grad(), quiet(), export_silenced():
            return torch.export.export(model, args, dynamic_shapes=tuple({0: batch} for _ in args))
    except Exception as exc:
        raise ConversionError(f"torch.export failed{export_failure(exc)}") from None


class _DropTorchRecords(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.name == "torch" or record.name.startswith("torch."))


@contextmanager
def export_silenced() -> Iterator[None]:
    """A failing torch.export prints its partial graph to stderr (twice) and logs warnings through
    torch's own handlers: the ConversionError's one line (``export_failure``) says it instead."""
    names = [n for n in list(logging.root.manager.loggerDict) if n.split(".")[0] == "torch"]
    handlers = {h for n in ("", *names) for h in logging.getLogger(n).handlers}
    drop = _DropTorchRecords()
    for handler in handlers:
        handler.addFilter(drop)
    try:
        with redirect_stderr(io.StringIO()):
            yield
    finally:
        for handler in handlers:
            handler.removeFilter(drop)


def export_failure(exc: BaseException) -> str:
    """`` (hint): first line (at file.py line N: code)`` for a torch.export error: where in the
    model it failed (torch names the call), and the way out. Data-dependent control flow is no
    case for tracing (a trace keeps the example's branch): it names TorchScript scripting."""
    text = str(exc)
    where = re.search(r'File "([^"]+)", line (\d+), in \w+\n\s*(.+)', text)
    at = f" (at {Path(where[1]).name} line {where[2]}: {where[3].strip()})" if where else ""
    if "data-dependent" in text or "DataDependent" in type(exc).__name__:
        hint = "data-dependent control flow; try --convert torchscript-script, or none"
    else:
        hint = "try --convert torchscript-trace"
    return f" ({hint}): {_one_line(exc)}{at}"


def save_torchscript(module: torch.jit.ScriptModule, path: Path) -> None:
    torch.jit.save(module, str(path))


def save_exported(program: torch.export.ExportedProgram, path: Path) -> None:
    with quiet():
        torch.export.save(program, str(path))


def save_state_dict(model: nn.Module, path: Path) -> None:
    torch.save(model.state_dict(), path)


def file_problem(path: Path, exc: BaseException) -> str:
    """Why ``path`` could not be read, in one line: torch says nothing of an empty file (an
    EOFError without a message)."""
    try:
        if path.stat().st_size == 0:
            return "the file is empty"
    except OSError:
        pass
    return _one_line(exc)


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip()
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return lines[0][:400] if lines else type(exc).__name__
