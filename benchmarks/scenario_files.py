"""Scenario files (``benchmarks/scenarios/*.yaml``): how to build an archive, which load tests to
run against it, and optionally an SLA search. ``torchbay bench scenario tiny`` runs one.

    name: tiny
    build: {reference: tiny}            # or {script: examples/digits/build.py, archive: ...}
    inputs: [path, ...]                 # request bodies; the reference models bring their own
    runs:
      - name: c16-b8-w1
        settings: {batch_size: 8, max_batch_delay_ms: 5, workers: 1}
        load: {concurrency: 16, duration_s: 20, warmup_s: 5}     # or rate:, arrival:
    sla: {sla_p99_ms: 10, batch_sizes: [1, 8], max_delays_ms: [5], workers: [1, 2]}

Relative paths are resolved against the repository root (the folder holding ``benchmarks/``).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from torchbay.benchmarks.errors import BenchError

REPO_ROOT = Path(__file__).resolve().parents[1]
BUNDLED_DIR = Path(__file__).resolve().with_name("scenarios")


class Build(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    reference: Literal["tiny", "cnn"] | None = None
    script: str | None = None
    archive: str | None = None


class Settings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    batch_size: int | None = Field(None, ge=1)
    max_batch_delay_ms: float | None = Field(None, ge=0)
    workers: int | None = Field(None, ge=1)


class Load(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    concurrency: int | None = Field(None, ge=1)
    rate: float | None = Field(None, gt=0)
    arrival: Literal["constant", "poisson"] = "constant"
    duration_s: float = Field(10.0, gt=0)
    warmup_s: float = Field(2.0, ge=0)


class RunSpec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    settings: Settings = Settings()
    load: Load


class Scenario(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    build: Build
    inputs: tuple[str, ...] = ()
    content_type: str | None = None
    runs: tuple[RunSpec, ...] = ()
    sla: dict[str, Any] | None = None


def bundled() -> list[str]:
    """Names of the scenario files shipped in ``benchmarks/scenarios/``."""
    return sorted(p.stem for p in BUNDLED_DIR.glob("*.yaml"))


def load_scenario(name_or_path: str | Path) -> Scenario:
    """Read a scenario file, or a bundled one by name; raises BenchError naming the problem."""
    path = Path(name_or_path)
    if not path.is_file():
        candidate = BUNDLED_DIR / f"{name_or_path}.yaml"
        if not candidate.is_file():
            raise BenchError(f"no scenario file {name_or_path!r}; bundled: {', '.join(bundled())}")
        path = candidate
    try:
        data = yaml.safe_load(path.read_text())
        return Scenario.model_validate(data)
    except (OSError, yaml.YAMLError) as exc:
        raise BenchError(f"cannot read {path}: {exc}") from None
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise BenchError(f"{path}: {where}: {first['msg']}") from None


def _resolve(path: str) -> Path:
    p = Path(path)
    return p if p.is_absolute() else REPO_ROOT / p


def build_archive(
    scenario: Scenario, out_dir: Path, log: Callable[[str], None]
) -> tuple[Path, list[Path]]:
    """Make the scenario's archive (and bodies, for reference models); returns (archive, inputs)."""
    inputs = [_resolve(p) for p in scenario.inputs]
    b = scenario.build
    if b.reference is not None:
        from torchbay.benchmarks import runner

        log(f"building the {b.reference} reference model and archive in {out_dir}")
        assets = runner.archive_models(runner.prepare_models(out_dir), out_dir, sys.executable)
        assert assets.model_store is not None
        return assets.model_store / f"{b.reference}.mar", inputs or [assets.body[b.reference]]
    if b.archive is None:
        raise BenchError(f"scenario {scenario.name}: build needs reference: or archive:")
    archive = _resolve(b.archive)
    if not archive.exists() or any(not p.exists() for p in inputs):
        if b.script is None:
            raise BenchError(f"{archive} is missing and the scenario has no build script")
        log(f"building with {b.script}")
        proc = subprocess.run([sys.executable, str(_resolve(b.script))], cwd=REPO_ROOT,
                              capture_output=True, text=True)  # fmt: skip
        if proc.returncode != 0:
            raise BenchError(f"{b.script} failed:\n{proc.stderr.strip()[-2000:]}")
    if not inputs:
        raise BenchError(f"scenario {scenario.name}: give inputs:")
    return archive, inputs


def run_scenario_file(
    scenario: Scenario,
    out_dir: Path | None = None,
    *,
    log: Callable[[str], None] = print,
    with_sla: bool = False,
    duration_s: float | None = None,
    warmup_s: float | None = None,
) -> dict[str, Any]:
    """Build, run every ``runs`` entry (a fresh server each) and, with ``with_sla``, the search.
    Returns {"runs": [...report dicts], "sla": winner or None, "text": human summary}."""
    from torchbay.benchmarks.bench import RunOptions, format_report, run_bench

    out = (out_dir or REPO_ROOT / "benchmarks" / "out") / "scenarios" / scenario.name
    out.mkdir(parents=True, exist_ok=True)
    archive, inputs = build_archive(scenario, out.parent.parent, log)
    reports, texts = [], []
    for spec in scenario.runs:
        log(f"{scenario.name}/{spec.name}")
        options = RunOptions(
            archive=archive,
            inputs=tuple(inputs),
            content_type=scenario.content_type,
            batch_size=spec.settings.batch_size,
            max_batch_delay_ms=spec.settings.max_batch_delay_ms,
            workers=spec.settings.workers,
            concurrency=spec.load.concurrency,
            rate=spec.load.rate,
            arrival=spec.load.arrival,
            duration_s=duration_s or spec.load.duration_s,
            warmup_s=spec.load.warmup_s if warmup_s is None else warmup_s,
            run_dir=out / spec.name,
        )
        report = run_bench(options)
        reports.append({"name": spec.name, **report.as_dict()})
        texts.append(f"== {scenario.name}/{spec.name}\n{format_report(report)}")
    sla_winner = None
    if with_sla and scenario.sla:
        from torchbay.benchmarks.sla import SlaOptions, run_sla

        sla_opts = SlaOptions(archive=archive, inputs=tuple(inputs), out_dir=out / "sla",
                              content_type=scenario.content_type, **scenario.sla)  # fmt: skip
        result = run_sla(sla_opts, log=log)
        sla_winner = result.winner.label if result.winner else None
        texts.append(f"== {scenario.name}/sla: winner {sla_winner}; report {out / 'sla'}")
    return {
        "scenario": scenario.name,
        "runs": reports,
        "sla": sla_winner,
        "text": "\n\n".join(texts),
    }
