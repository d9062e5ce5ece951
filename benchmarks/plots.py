"""PNG plots of the SLA search and of round two's overload sweep (matplotlib, imported lazily;
figures drawn without pyplot, so no display or backend is needed)."""

from __future__ import annotations

import math
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torchbay.benchmarks.errors import BenchError

if TYPE_CHECKING:
    from torchbay.benchmarks.sla_model import SlaResult, Step


def _figure(rows: int, cols: int, size: tuple[float, float]) -> tuple[Any, Any]:
    """A figure and its grid of axes (``rows`` x ``cols``, always 2-D)."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise BenchError("plots need matplotlib: pip install 'torchbay[bench]'") from None
    fig = Figure(figsize=size)
    return fig, fig.subplots(rows, cols, squeeze=False)


def _save(fig: Any, path: Path, dpi: int = 100) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    return path


def _p99(ax: Any, steps: list[Step], **style: Any) -> None:
    """The steps' p99 against their throughput, as points."""
    ax.scatter(
        [s.result.ok_per_s for s in steps], [s.result.latency.p99_ms for s in steps], **style
    )


def latency_vs_throughput(result: SlaResult, path: Path) -> Path:
    shown = [oc for oc in result.outcomes if any(s.phase != "probe" for s in oc.steps)]
    n = max(1, len(shown))
    cols, rows = min(3, n), math.ceil(n / min(3, n))
    fig, axes = _figure(rows, cols, (4.2 * cols, 3.2 * rows))
    sla = result.options.sla_p99_ms
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    for ax, oc in zip(axes.flat, shown, strict=False):
        searched = [s for s in oc.steps if s.phase in ("ramp", "bisect")]
        steps = sorted(searched, key=lambda s: s.offered_rate)
        if oc.runs:
            _p99(ax, oc.runs, marker="x", color="purple", zorder=4, s=24, label="p99, repeats")
        x = [s.result.ok_per_s for s in steps]
        for attr, style in (("p50_ms", ":"), ("p90_ms", "--"), ("p99_ms", "-")):
            y = [getattr(s.result.latency, attr) for s in steps]
            ax.plot(x, y, style, marker=".", label=attr.removesuffix("_ms"))
        breached = [s for s in steps if not s.passed]  # by p99 or by errors
        _p99(ax, breached, color="red", zorder=3, s=18, label="breach")
        ax.axhline(sla, color="black", linewidth=1, label=f"SLA p99 {sla:g} ms")
        ax.set_yscale("log")
        ax.set_title(oc.label, fontsize=9)
        ax.set_xlabel("throughput (ok req/s)", fontsize=8)
        ax.set_ylabel("latency (ms)", fontsize=8)
        ax.tick_params(labelsize=7)
    if shown:
        axes.flat[0].legend(fontsize=6)
    fig.suptitle(f"{result.model}: latency against throughput (open loop)", fontsize=10)
    return _save(fig, path)


def best_throughput(result: SlaResult, path: Path) -> Path:
    """One bar per configuration; a skipped or infeasible one is empty, its status in its label."""
    outcomes = result.outcomes
    fig, ((ax,),) = _figure(1, 1, (7, 0.35 * len(outcomes) + 1.2))
    scored = {oc.label for oc in outcomes if oc.status in ("searched", "same-as")}
    winner = result.winner.label if result.winner else None
    ax.barh(
        [oc.label + ("" if oc.label in scored else f" ({oc.status})") for oc in outcomes],
        [oc.best_rate if oc.label in scored else 0.0 for oc in outcomes],
        color=["tab:green" if oc.label == winner else "tab:blue" for oc in outcomes],
    )
    ax.invert_yaxis()
    ax.set_xlabel(f"best rate with p99 <= {result.options.sla_p99_ms:g} ms (req/s)")
    ax.set_title(f"{result.model}: throughput under the SLA per configuration", fontsize=10)
    ax.tick_params(labelsize=7)
    return _save(fig, path)


def sweep_plot(sweep: dict[str, list[dict[str, Any]]], path: Path, title: str) -> Path | None:
    """Goodput and admitted p99 against offered load, one line per system; None when empty."""
    if not any(sweep.values()):
        return None
    fig, ((left, right),) = _figure(1, 2, (10, 4))
    for system, points in sweep.items():
        offered = [p["offered_per_s"] for p in points]
        left.plot(offered, [p["goodput_per_s"] for p in points], marker="o", label=system)
        right.plot(offered, [p["admitted_p99_ms"] for p in points], marker="o", label=system)
    top = max(p["offered_per_s"] for points in sweep.values() for p in points)
    left.plot([0, top], [0, top], ":", color="grey", label="offered")
    left.set(xlabel="offered req/s", ylabel="goodput (200s/s)", title="goodput")
    p99 = "p99 of 200s, ms (from scheduled send)"
    right.set(xlabel="offered req/s", ylabel=p99, title="admitted p99", yscale="log")
    for ax in (left, right):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(textwrap.fill(title, 140), fontsize=8)
    path.parent.mkdir(parents=True, exist_ok=True)
    return _save(fig, path, dpi=110)
