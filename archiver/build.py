"""Build the serialized model of an archive: precision, conversion, save, parity (imports torch).

Called by ``package.package`` when the model is transformed or an example input is given.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from torchbay.archiver import convert
from torchbay.archiver import record_signature as rs
from torchbay.archiver.errors import ConversionError
from torchbay.archiver.manifest import Format, Parity, Tolerance
from torchbay.archiver.parity import DEFAULT_TOLERANCES, check, check_rows_independent
from torchbay.handlers.runtime.exits import ProcessExit, exits_refused

if TYPE_CHECKING:
    from torchbay.archiver.options import ArchiveOptions, Stage


@contextmanager
def model_dir_on_path(stage: Stage) -> Iterator[None]:
    """The files staged so far (extra files, the handler) linked into one folder on sys.path, as
    the worker's model directory is: a model file imports its sibling modules from there, and
    from there only (what the archive does not hold, the worker would not find). The modules
    imported from it are forgotten afterwards."""
    folder = stage.root / "model_dir"
    for name, source in stage.files.items():
        link = folder / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(Path(source).resolve())
    sys.path.insert(0, str(folder))
    try:
        with exits_refused():  # the model's code (its class, its forward) that calls sys.exit()
            yield
    except ProcessExit as exc:
        raise ConversionError(f"the model's code tried to end the process: {exc!r}") from None
    finally:
        sys.path.remove(str(folder))
        for name, module in list(sys.modules.items()):
            if str(getattr(module, "__file__", None) or "").startswith(str(folder)):
                del sys.modules[name]


def build_model(
    options: ArchiveOptions,
    stage: Stage,
    source: Format,
    target: Format,
    serialized: Path,
    model_file: Path | None,
) -> tuple[str, str | None, Parity, dict[str, Any]]:
    """Stage the (converted) model and the example; returns (serializedFile, modelFile, parity,
    the manifest fields recorded from the example and a run of the packed model), inside
    :func:`model_dir_on_path`. Raises ConversionError / ParityError / ArchiveArgumentError."""
    assert options.example_input is not None
    program: Any = None
    if source == "eager":
        assert model_file is not None
        reference: nn.Module = convert.load_eager(model_file, serialized)
    elif source == "exported":  # packed as it is; its own dynamic dimensions are recorded
        program = convert.load_exported(serialized)
        reference = program.module()
    else:
        reference = convert.load_torchscript(serialized)
    example = rs.load_example(Path(options.example_input), reference)
    rs.check_batches(example)
    _run_reference(reference, example)
    packed = _apply_precision(options.precision, reference, source, target, serialized, example)
    name, model_name, program = _stage_model(
        options, stage, target, serialized, model_file, packed, example, program
    )
    example_name, example_path = rs.save_example(example, stage.root / "generated")
    stage.files[example_name] = example_path

    parity, output = _parity(options, stage, target, name, model_name, reference, example)
    if options.handler == "tensor":
        _tensors_only(output)
    dynamic = rs.exported_dynamic_dims(program) if program is not None else None
    declared = _declared(example, options.precision)
    return name, model_name, parity, _recorded(declared, example_name, output, dynamic)


def _stage_model(
    options: ArchiveOptions,
    stage: Stage,
    target: Format,
    serialized: Path,
    model_file: Path | None,
    packed: nn.Module,
    example: rs.Example,
    program: Any,
) -> tuple[str, str | None, Any]:
    """Stage the packed model: (serializedFile, modelFile, the exported program or None)."""
    if target == "eager":
        name = serialized.name
        if options.precision == "fp32":
            stage.add(name, serialized)
        else:
            convert.save_state_dict(packed, stage.written(name))
        assert model_file is not None
        stage.add(model_file.name, model_file)
        return name, model_file.name, None
    if target == "torchscript":
        module = _to_torchscript(options.convert, packed, example)
        if options.optimize:
            module = convert.freeze(module)
        name = serialized.name if options.convert == "none" else "model.pt"
        convert.save_torchscript(module, stage.written(name))
        return name, None, None
    if target == "aoti":
        from torchbay.archiver import aoti

        dtype = convert._DTYPES.get(options.precision)
        x = example.map(lambda t: t.to(dtype) if dtype and t.is_floating_point() else t)
        program = aoti.compile_package(
            packed, x.tensors, stage.written("model.pt2"), options.device
        )
        return "model.pt2", None, program
    if program is not None:  # an exported program given as it is
        stage.add(serialized.name, serialized)
        return serialized.name, None, program
    dtype = convert._DTYPES.get(options.precision)
    x = example.map(lambda t: t.to(dtype) if dtype and t.is_floating_point() else t)
    program = convert.export(packed, x.tensors)
    convert.save_exported(program, stage.written("model.pt2"))
    return "model.pt2", None, program


def _tensors_only(output: Any) -> None:
    """ConversionError naming the first output the tensor handler cannot answer (a nested tuple,
    None, a number): it serves a tensor, or a tuple, list or dict of tensors."""
    if isinstance(output, dict):
        named = [(str(k), v) for k, v in output.items()]
    elif isinstance(output, list | tuple):
        named = [(f"output{i}", v) for i, v in enumerate(output)]
    else:
        named = [("output0", output)]
    for name, value in named:
        if not isinstance(value, torch.Tensor):
            raise ConversionError(
                f"the model's output {name!r} is a {type(value).__name__}, not a tensor: the "
                "tensor handler serves a tensor, or a tuple, list or dict of tensors"
            )


def _declared(example: rs.Example, precision: str) -> rs.Example:
    """The example as the packed model takes it: an fp16/bf16 model declares its floating inputs
    in its own dtype (FP16/BF16), the datatype it serves without a cast."""
    half = convert._DTYPES.get(precision)
    return example.map(lambda t: t.to(half) if half and t.is_floating_point() else t)


def _recorded(
    example: rs.Example,
    example_name: str,
    output: Any,
    dynamic: tuple[list[set[int]], list[set[int]]] | None,
) -> dict[str, Any]:
    """The manifest's example, signature and (one input only) legacy input fields."""
    inputs = rs.input_specs(example, dynamic[0] if dynamic else None)
    outputs = rs.output_specs(output, example.batch, dynamic[1] if dynamic else None)
    fields: dict[str, Any] = {"example_input": example_name, "inputs": inputs, "outputs": outputs}
    if len(example.tensors) == 1:  # older readers know one input only
        fields["input_shape"] = list(example.first.shape[1:])
        fields["input_dtype"] = str(example.first.dtype).removeprefix("torch.")
    return fields


def _run_reference(reference: nn.Module, example: rs.Example) -> None:
    if isinstance(reference, torch.jit.ScriptModule):
        try:
            with torch.inference_mode(), convert.quiet():
                reference(*example.tensors)
        except Exception as exc:
            shapes = [list(t.shape) for t in example.tensors]
            raise ConversionError(
                f"the model fails on the example input {shapes[0] if len(shapes) == 1 else shapes}"
                f": {str(exc).strip().splitlines()[0]}"
            ) from None
        return
    convert.locate_failure(reference, example.tensors, "the example input")


def _apply_precision(
    precision: str,
    reference: nn.Module,
    source: Format,
    target: Format,
    serialized: Path,
    example: rs.Example,
) -> nn.Module:
    if precision == "fp32":
        return reference
    if precision == "int8-dynamic":
        if source == "torchscript":
            raise ConversionError(
                "int8-dynamic needs the eager model (--model-file and a state dict): a "
                "TorchScript file cannot be re-quantized"
            )
        types = convert.EAGER_QUANTIZABLE if target == "eager" else convert.QUANTIZABLE
        quantized = convert.quantize_int8(reference, types)
        convert.locate_failure(quantized, example.tensors, "int8-dynamic")
        return quantized
    # fp16 / bf16
    if source == "torchscript":
        cast: nn.Module = convert.load_torchscript(serialized).to(convert._DTYPES[precision])
    else:
        cast = convert.cast(reference, precision)
        half = convert._DTYPES[precision]
        x = example.map(lambda t: t.to(half) if t.is_floating_point() else t)
        convert.locate_failure(cast, x.tensors, precision)
    if target != "torchscript":
        return cast  # exported programs are specialized on the (half) input dtype
    if len(example.tensors) > 1:
        raise ConversionError(
            f"{precision} TorchScript takes one input; for a model with several inputs use "
            f"--convert export or the eager model with --precision {precision}"
        )
    return convert.with_cast(cast, precision)


def _to_torchscript(how: str, packed: nn.Module, example: rs.Example) -> Any:
    if how == "torchscript-trace":
        return convert.trace(packed, example.tensors)
    if isinstance(packed, torch.jit.ScriptModule):
        return packed
    return convert.script(packed)


def _parity(
    options: ArchiveOptions,
    stage: Stage,
    target: Format,
    serialized_name: str,
    model_file_name: str | None,
    reference: nn.Module,
    example: rs.Example,
) -> tuple[Parity, Any]:
    """Load the staged model as a worker does (torchbay.handlers.runtime.loading) and compare;
    returns the parity and the packed model's output on the example."""
    from torchbay.handlers.errors import HandlerError
    from torchbay.handlers.runtime.loading import load_model, model_input_dtype

    load_dir = stage.root / "parity"
    load_dir.mkdir()
    for name in filter(None, (serialized_name, model_file_name)):
        shutil.copyfile(stage.files[name], load_dir / name)
    manifest: dict[str, Any] = {
        "model": {
            "modelName": options.model_name,
            "serializedFile": serialized_name,
            "handler": options.handler,
            **({"modelFile": model_file_name} if model_file_name else {}),
        },
        "torchbay": {
            "format": target,
            "precision": options.precision,
            "optimized": options.optimize,
        },
    }
    try:
        with convert.quiet():
            loaded = load_model(load_dir, manifest, options.device)
    except HandlerError as exc:
        raise ConversionError(f"the packed model does not load: {exc}") from None
    dtype = model_input_dtype(loaded, manifest)

    def run_packed(x: rs.Example) -> Any:
        return _run_on(loaded, x, dtype, options.device)

    def run_reference(x: rs.Example) -> Any:
        with convert.quiet():
            return reference(*x.tensors)

    what = f"{options.precision} {target}" + (" (optimized)" if options.optimize else "")
    batched = _served_batched(options)
    parity = check(
        run_reference,
        run_packed,
        _parity_inputs(example) if batched else [example],  # unbatched: the whole input only
        default_tolerance(options),
        allow_drift=options.allow_drift,
        what=what,
        batched=batched,
    )
    if batched:
        check_rows_independent(run_reference, example)
    with torch.inference_mode():
        return parity, run_packed(example)


def _parity_inputs(example: rs.Example) -> list[rs.Example]:
    """The example, one row of it, and batches past it (a trace may have fixed the batch size,
    and the server batches requests together)."""
    return [example.rows(n) for n in dict.fromkeys((example.batch, 1, 3, example.batch + 1))]


def _run_on(loaded: Any, x: rs.Example, dtype: torch.dtype, device: str) -> Any:
    """The loaded model on ``x`` (floating inputs cast to ``dtype``) on ``device``; CPU outputs."""
    args = (t.to(device, dtype) if t.is_floating_point() else t.to(device) for t in x.tensors)
    with convert.quiet():
        out = loaded(*args)
    return out if device == "cpu" else _to_cpu(out)


def _to_cpu(output: Any) -> Any:
    if isinstance(output, torch.Tensor):
        return output.cpu()
    if isinstance(output, list | tuple):
        return type(output)(_to_cpu(o) for o in output)
    if isinstance(output, dict):
        return {k: _to_cpu(v) for k, v in output.items()}
    return output


def _served_batched(options: ArchiveOptions) -> bool:
    """Whether the archive is served batched: the recorded signature always is, unless the
    model-config.yaml's ``inputs`` declare no batch dimension (Triton's ``max_batch_size: 0``)."""
    if options.config_file is None:
        return True
    import yaml

    from torchbay.archiver.signature import SignatureError, model_signature

    config = yaml.safe_load(Path(options.config_file).read_text()) or {}
    try:
        declared = model_signature({}, config)
    except SignatureError:
        return True  # the server refuses the archive's signature when it loads
    return declared is None or not declared.inputs or declared.batched


def default_tolerance(options: ArchiveOptions) -> Tolerance:
    """The precision's default limits with --tolerance / --min-top1-agreement applied."""
    base = DEFAULT_TOLERANCES[options.precision]
    update: dict[str, float] = {}
    if options.tolerance is not None:
        update["max_rel_error"] = options.tolerance
    if options.min_top1_agreement is not None:
        update["min_top1_agreement"] = options.min_top1_agreement
    return base.model_copy(update=update)
