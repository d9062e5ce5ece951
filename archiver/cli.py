"""The archiver's verbs: ``torchbay archive | inspect | verify``. Importable without torch."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

_TS_DEFAULTS = "same meaning as torch-model-archiver's"


def register(subparsers: Any) -> None:
    """Add the archiver's verbs to the ``torchbay`` command."""
    _add_archive(subparsers)
    p = _add_reader(
        subparsers,
        "inspect",
        inspect_command,
        help="print an archive's manifest, files, hashes and parity",
    )
    p.add_argument("--json", action="store_true", help="print JSON")

    p = _add_reader(
        subparsers,
        "verify",
        verify_command,
        help="unpack an archive, load it as a worker does and run sample inputs",
        description="Run an archive's handler on sample inputs exactly as a worker would and "
        "print each response. Exit status 1 on a 5xx (or when the stored example is refused).",
    )
    p.add_argument(
        "--input",
        type=Path,
        nargs="+",
        action="extend",
        dest="inputs",
        metavar="FILE",
        help="request body file(s), one request each (default: the stored example)",
    )
    p.add_argument("--content-type", help="request content type (default: from --input's suffix)")
    p.add_argument("--handler", help="override the manifest's handler")
    p.add_argument(
        "--batch-size", type=int, default=1, help="requests per handler call (default 1)"
    )


def _add_reader(
    subparsers: Any, name: str, command: Callable[[argparse.Namespace], int], **kwargs: str
) -> argparse.ArgumentParser:
    """A verb that reads one archive, its first argument."""
    p = subparsers.add_parser(name, **kwargs)
    p.add_argument("archive", type=Path, help=".mar, .tar.gz or archive directory")
    p.set_defaults(func=command)
    return p


def _add_archive(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "archive",
        help="pack a model into a .mar (torch-model-archiver's flags, plus convert and check)",
        description="Pack a model as torch-model-archiver does; optionally convert it "
        "(TorchScript, torch.export), change its precision and check parity.",
    )
    p.add_argument("--model-name", required=True, help="archive name (^[A-Za-z0-9][\\w\\-.]*$)")
    p.add_argument("-v", "--version", required=True, help="model version, e.g. 1.0")
    p.add_argument("--serialized-file", type=Path, help="state dict (.pt/.pth) or TorchScript")
    p.add_argument("--model-file", type=Path, help="Python file with one nn.Module class")
    p.add_argument(
        "--handler",
        required=True,
        help="built-in (tensor, image_classifier, image_segmenter, object_detector, "
        "text_classifier) or file.py[:function]",
    )
    p.add_argument(
        "--extra-files", default="", help="comma list; a directory's contents go to the root"
    )
    p.add_argument("-r", "--requirements-file", type=Path)
    p.add_argument("-c", "--config-file", type=Path, help="model-config.yaml")
    p.add_argument("--export-path", type=Path, default=Path("."), help="default: current dir")
    p.add_argument(
        "--archive-format",
        choices=["default", "zip-store", "no-archive", "tgz"],
        default="default",
        help="default: deflated .mar; zip-store: stored .mar; tgz: .tar.gz; no-archive: folder",
    )
    p.add_argument("-f", "--force", action="store_true", help="overwrite an existing archive")
    p.add_argument("--runtime", choices=["python", "python3"], default="python")
    _add_conversion(p)
    p.add_argument(
        "--example-input",
        type=Path,
        help="the model's input, batch dimension first: a tensor (torch.save or .npy) is input0; "
        "a tuple of tensors (torch.save) is input0, input1, ...; a dict of tensors (torch.save "
        "or .npz) names the inputs (in forward's parameter order when its keys are forward's "
        "parameters). With it the archive records the model's signature (input and output "
        "names, OIP datatypes, shapes with -1 for the batch and other dynamic dimensions) from "
        "a run of the packed model: the server's /v2 model metadata",
    )
    p.add_argument(
        "--tolerance", type=float, help="max relative error (max|a-b| / max|a|) to accept"
    )
    p.add_argument("--min-top1-agreement", type=float, help="minimum top-1 agreement to accept")
    p.add_argument("--allow-drift", action="store_true", help="pack even past tolerance (recorded)")
    p.set_defaults(func=archive_command)


def _add_conversion(p: argparse.ArgumentParser) -> None:
    """--convert, --device, --precision, --optimize."""
    p.add_argument(
        "--convert",
        choices=["none", "torchscript-trace", "torchscript-script", "export", "aoti"],
        default="none",
        help="convert an eager model (--model-file + state dict); default none. aoti: "
        "torch.export + AOTInductor to a compiled .pt2 package (needs a C++ compiler)",
    )
    p.add_argument(
        "--device",
        choices=["cpu", "cuda"],
        default="cpu",
        help="--convert aoti: compile for this device (cuda needs a GPU on the packing host)",
    )
    p.add_argument("--precision", choices=["fp32", "fp16", "bf16", "int8-dynamic"], default="fp32")
    p.add_argument(
        "--optimize", action="store_true", help="TorchScript: freeze + optimize_for_inference"
    )


def archive_command(args: argparse.Namespace) -> int:
    from torchbay.archiver.manifest import read_manifest
    from torchbay.archiver.package import ArchiveOptions, package

    options = ArchiveOptions(
        model_name=args.model_name,
        version=args.version,
        handler=args.handler,
        serialized_file=args.serialized_file,
        model_file=args.model_file,
        extra_files=args.extra_files,
        requirements_file=args.requirements_file,
        config_file=args.config_file,
        export_path=args.export_path,
        archive_format=args.archive_format,
        force=args.force,
        runtime=args.runtime,
        convert=args.convert,
        device=args.device,
        precision=args.precision,
        optimize=args.optimize,
        example_input=args.example_input,
        tolerance=args.tolerance,
        min_top1_agreement=args.min_top1_agreement,
        allow_drift=args.allow_drift,
    )
    out = package(options)
    tb = read_manifest(out).torchbay
    summary = f"wrote {out}"
    if tb is not None:
        summary += f" ({tb.format}, {tb.precision}"
        if tb.parity is not None:
            p = tb.parity
            summary += f", parity max_rel_error={p.max_rel_error:.3g}"
            if p.top1_agreement is not None:
                summary += f" top1_agreement={p.top1_agreement:.3f}"
            if not p.passed:
                summary += " PAST TOLERANCE (--allow-drift)"
        summary += ")"
    print(summary)
    return 0


def inspect_command(args: argparse.Namespace) -> int:
    from torchbay.archiver.inspect import inspect_archive

    print(inspect_archive(args.archive, as_json=args.json))
    return 0


def verify_command(args: argparse.Namespace) -> int:
    from torchbay.archiver.verify import render, verify_archive

    report = verify_archive(
        args.archive,
        input_files=args.inputs or (),
        content_type=args.content_type,
        handler=args.handler,
        batch_size=args.batch_size,
    )
    print(render(report))
    for result in report.failures:
        text = result.body.decode("utf-8", "replace").strip()
        print(
            f"torchbay: error: verify failed: {result.input_description}: the handler answered "
            f"{result.status}: {text}",
            file=sys.stderr,
        )
    return 1 if report.failures else 0
