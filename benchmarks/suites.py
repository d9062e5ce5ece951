"""Run a :class:`~torchbay.benchmarks.scenarios.Suite` (``torchbay bench scenario tiny``): build
its archive, run each of its scenarios with ``bench run`` on a fresh server, and optionally its
SLA search. The suites themselves are described in ``scenarios.py``.

Everything lands under ``<out>/scenarios/<suite>/`` (``benchmarks/out/`` by default, gitignored):
one folder per run and ``sla/`` for the search's report.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torchbay.benchmarks.errors import BenchError
from torchbay.benchmarks.scenarios import Scenario, Suite

if TYPE_CHECKING:
    from torchbay.benchmarks.bench import RunOptions

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO_ROOT / "benchmarks" / "out"


def _resolve(path: str) -> Path:
    p = Path(path)
    return p if p.is_absolute() else REPO_ROOT / p


def build_archive(
    suite: Suite, out_dir: Path, log: Callable[[str], None]
) -> tuple[Path, list[Path]]:
    """Make the suite's archive (and bodies, for reference models); returns (archive, inputs)."""
    inputs = [_resolve(p) for p in suite.inputs]
    if suite.archive is None:
        from torchbay.benchmarks import runner

        log(f"building the {suite.model} reference model and archive in {out_dir}")
        assets = runner.archive_models(runner.prepare_models(out_dir), out_dir, sys.executable)
        assert assets.model_store is not None
        return assets.model_store / f"{suite.model}.mar", inputs or [assets.body[suite.model]]
    archive = _resolve(suite.archive)
    if not archive.exists() or any(not p.exists() for p in inputs):
        if suite.script is None:
            raise BenchError(f"{archive} is missing and the suite has no build script")
        log(f"building with {suite.script}")
        proc = subprocess.run(
            [sys.executable, str(_resolve(suite.script))],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            raise BenchError(f"{suite.script} failed:\n{proc.stderr.strip()[-2000:]}")
    if not inputs:
        raise BenchError(f"suite {suite.name}: give inputs")
    return archive, inputs


def run_options(
    suite: Suite,
    run: Scenario,
    archive: Path,
    inputs: list[Path],
    run_dir: Path,
    *,
    duration_s: float | None = None,
    warmup_s: float | None = None,
) -> RunOptions:
    """``bench run``'s options for one scenario of the suite (durations: the suite's unless
    overridden)."""
    from torchbay.benchmarks.bench import RunOptions

    return RunOptions(
        archive=archive,
        inputs=tuple(inputs),
        content_type=suite.content_type,
        batch_size=run.batch_size,
        max_batch_delay_ms=run.max_batch_delay_ms,
        workers=run.workers,
        concurrency=run.concurrency,
        rate=run.rate,
        arrival=run.arrival,
        duration_s=duration_s or suite.duration_s,
        warmup_s=suite.warmup_s if warmup_s is None else warmup_s,
        run_dir=run_dir,
    )


def run_suite(
    suite: Suite,
    out_dir: Path | None = None,
    *,
    log: Callable[[str], None] = print,
    with_sla: bool = False,
    duration_s: float | None = None,
    warmup_s: float | None = None,
) -> dict[str, Any]:
    """Build, run every scenario of the suite (a fresh server each) and, with ``with_sla``, the
    search. Returns {"scenario", "runs": [...report dicts], "sla": winner or None, "text"}."""
    from torchbay.benchmarks.bench import format_report, run_bench

    out = (out_dir or DEFAULT_OUT) / "scenarios" / suite.name
    out.mkdir(parents=True, exist_ok=True)
    archive, inputs = build_archive(suite, out.parent.parent, log)
    reports, texts = [], []
    for run in suite.runs:
        log(f"{suite.name}/{run.name}")
        options = run_options(
            suite, run, archive, inputs, out / run.name, duration_s=duration_s, warmup_s=warmup_s
        )
        report = run_bench(options)
        reports.append({"name": run.name, **report.as_dict()})
        texts.append(f"== {suite.name}/{run.name}\n{format_report(report)}")
    sla_winner = None
    if with_sla and suite.sla:
        from torchbay.benchmarks.sla import SlaOptions, run_sla

        sla_opts = SlaOptions(
            archive=archive,
            inputs=tuple(inputs),
            out_dir=out / "sla",
            content_type=suite.content_type,
            **suite.sla,
        )
        result = run_sla(sla_opts, log=log)
        sla_winner = result.winner.label if result.winner else None
        texts.append(f"== {suite.name}/sla: winner {sla_winner}; report {out / 'sla'}")
    return {"scenario": suite.name, "runs": reports, "sla": sla_winner, "text": "\n\n".join(texts)}
