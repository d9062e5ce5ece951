"""The parity check: the reference model against the packed model as the server will load it.

Metrics over every output tensor (flattened, as float64):
  max_abs_error = max |a - b|
  max_rel_error = max |a - b| / max |a|   (relative to the output's scale, so logits near zero
                                           do not blow it up as an element-wise ratio would)
  top1_agreement = share of rows whose argmax matches, for outputs shaped [batch, classes>1].
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from torchbay.archiver.errors import ConversionError, ParityError
from torchbay.archiver.manifest import Parity, Tolerance

# Chosen so a healthy conversion packs without flags: the digits CNN measures ~1e-7 (fp32),
# ~1e-3 (fp16), ~1e-2 (bf16, int8) relative error with full top-1 agreement.
DEFAULT_TOLERANCES: dict[str, Tolerance] = {
    "fp32": Tolerance(max_rel_error=1e-4),
    "fp16": Tolerance(max_rel_error=5e-2, min_top1_agreement=0.9),
    "bf16": Tolerance(max_rel_error=1e-1, min_top1_agreement=0.9),
    "int8-dynamic": Tolerance(max_rel_error=1e-1, min_top1_agreement=0.9),
}
# How far the reference's answer for a row alone may differ from its answer within a batch:
# kernels may sum in another order for another batch size, and a reference that is itself half
# precision or quantized per tensor (torch.ao's dynamic int8) rounds with the batch's range. A
# BatchNorm or Dropout in training mode is off by the output's own scale.
ROW_TOLERANCE = 5e-2


def _tensors(output: Any) -> list[torch.Tensor]:
    if isinstance(output, torch.Tensor):
        return [output]
    if isinstance(output, dict):
        return [t for v in output.values() for t in _tensors(v)]
    if isinstance(output, list | tuple):
        return [t for v in output for t in _tensors(v)]
    return []


def measure(reference: Any, packed: Any) -> tuple[float, float, float | None]:
    """(max_abs_error, max_rel_error, top1_agreement) between two model outputs."""
    refs, outs = _tensors(reference), _tensors(packed)
    if not refs or len(refs) != len(outs):
        raise ConversionError(
            f"packed model returns {len(outs)} tensor(s), the reference {len(refs)}"
        )
    max_abs, scale, agree, rows = 0.0, 0.0, 0, 0
    for a, b in zip(refs, outs, strict=True):
        if a.shape != b.shape:
            raise ConversionError(
                f"packed model output shape {list(b.shape)} differs from the reference "
                f"{list(a.shape)}"
            )
        a64, b64 = a.detach().double(), b.detach().double()
        if a64.numel():
            # Equal values (the same infinity included) do not differ; a NaN or an infinity the
            # reference does not have does, without bound (max() would skip a NaN).
            diff = torch.where(a64 == b64, 0.0, (a64 - b64).abs())
            max_abs = max(max_abs, diff.nan_to_num(nan=math.inf, posinf=math.inf).max().item())
            finite = a64[a64.isfinite()].abs()
            scale = max(scale, finite.max().item() if finite.numel() else 0.0)
        if a.dim() == 2 and a.shape[1] > 1:
            agree += int((a64.argmax(1) == b64.argmax(1)).sum().item())
            rows += a.shape[0]
    max_rel = max_abs / scale if scale > 0 else max_abs
    top1 = agree / rows if rows else None
    return max_abs, max_rel, top1


def _named(output: Any) -> list[tuple[str, torch.Tensor]]:
    """The output's tensors with the names the signature gives them (output0.., a dict's keys)."""
    if isinstance(output, dict):
        items = [(str(k), v) for k, v in output.items()]
    elif isinstance(output, list | tuple):
        items = [(f"output{i}", v) for i, v in enumerate(output)]
    else:
        items = [("output0", output)]
    return [(name, t) for name, v in items for t in _tensors(v)]


def check_batch_dimension(output: Any, rows: int) -> None:
    """ConversionError unless every output has one row per input row: the server concatenates
    requests and splits each output along its first dimension."""
    for name, t in _named(output):
        if t.dim() == 0 or t.shape[0] != rows:
            raise ConversionError(
                f"the packed model's output {name!r} has shape {list(t.shape)} on a batch of "
                f"{rows}: the server needs one row per input row in every output (a batch "
                "dimension first, not fixed by a trace); declare inputs without a batch "
                "dimension in model-config.yaml to serve it unbatched"
            )


def check_rows_independent(run: Callable[[Any], Any], example: Any) -> None:
    """ConversionError when the reference answers the example's first row alone otherwise than
    within the whole example: the server batches requests, so a row's answer must not depend on
    the rows beside it (a BatchNorm or Dropout saved in training mode makes it so)."""
    if _rows(example) < 2:
        return
    with torch.inference_mode():
        whole, alone = run(example), run(example.rows(1))
    firsts = [t[:1] for t in _tensors(whole)]
    _, rel, _ = measure(firsts, alone)
    if not rel <= ROW_TOLERANCE:
        raise ConversionError(
            f"the model answers a row differently alone than in a batch (max_rel_error "
            f"{rel:.3g}): the server batches requests together, so a row's answer must not "
            "depend on the others; save the model in eval mode (BatchNorm, Dropout)"
        )


def _rows(x: Any) -> int:
    """The batch size of one input: a tensor, or anything with ``tensors`` (several inputs)."""
    first = x if isinstance(x, torch.Tensor) else x.tensors[0]
    return int(first.shape[0])


def check(
    run_reference: Callable[[Any], Any],
    run_packed: Callable[[Any], Any],
    inputs: list[Any],
    tolerance: Tolerance,
    *,
    allow_drift: bool,
    what: str,
    batched: bool = True,
) -> Parity:
    """Compare both models on every input (a tensor, or an ``Example`` of several for
    multi-input models); ParityError past tolerance unless ``allow_drift``. ``batched``: every
    output must keep the batch dimension first (``check_batch_dimension``)."""
    max_abs, max_rel, agree, rows = 0.0, 0.0, 0.0, 0
    top1_seen = False
    for x in inputs:
        with torch.inference_mode():
            ref = _run(run_reference, x, "model")
            out = _run(run_packed, x, "packed model")
        if batched:
            check_batch_dimension(out, _rows(x))
        a, r, t = measure(ref, out)
        max_abs, max_rel = max(max_abs, a), max(max_rel, r)
        if t is not None:
            top1_seen = True
            agree += t * _rows(x)
            rows += _rows(x)
    top1 = agree / rows if top1_seen and rows else None
    problems = _problems(max_abs, max_rel, top1, tolerance)
    parity = Parity(
        max_abs_error=max_abs,
        max_rel_error=max_rel,
        top1_agreement=top1,
        tolerance=tolerance,
        passed=not problems,
        allowed_drift=bool(problems) and allow_drift,
    )
    if problems and not allow_drift:
        raise ParityError(
            f"parity check failed for {what}: {'; '.join(problems)}. Raise the limit with "
            "--tolerance REL (or --min-top1-agreement), or pack anyway with --allow-drift",
            parity=parity.model_dump(),
        )
    return parity


def _run(run: Callable[[Any], Any], x: Any, which: str) -> Any:
    """``run(x)``; ConversionError naming the batch size when it raises."""
    try:
        return run(x)
    except Exception as exc:
        lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()] or [repr(exc)]
        # TorchScript's interpreter puts its own error last, under its traceback
        scripted = lines[0].startswith("The following operation failed")
        raise ConversionError(
            f"the {which} fails on a batch of {_rows(x)}: {lines[-1] if scripted else lines[0]}"
        ) from None


def _problems(
    max_abs: float, max_rel: float, top1: float | None, tolerance: Tolerance
) -> list[str]:
    problems = []
    if not (math.isfinite(max_abs) and math.isfinite(max_rel)):
        problems.append("the packed model's outputs are not finite (nan/inf)")
    if tolerance.max_abs_error is not None and max_abs > tolerance.max_abs_error:
        problems.append(f"max_abs_error {max_abs:.3g} > tolerance {tolerance.max_abs_error:.3g}")
    if tolerance.max_rel_error is not None and max_rel > tolerance.max_rel_error:
        problems.append(f"max_rel_error {max_rel:.3g} > tolerance {tolerance.max_rel_error:.3g}")
    if (
        tolerance.min_top1_agreement is not None
        and top1 is not None
        and top1 < tolerance.min_top1_agreement
    ):
        problems.append(f"top1_agreement {top1:.3f} < required {tolerance.min_top1_agreement:.3f}")
    return problems
