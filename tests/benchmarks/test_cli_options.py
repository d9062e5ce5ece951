"""``torchbay bench run|sla`` flags map one to one onto RunOptions / SlaOptions fields."""

from __future__ import annotations

import argparse
from pathlib import Path

from torchbay.benchmarks import cli
from torchbay.benchmarks.bench import RunOptions
from torchbay.benchmarks.sla import SlaOptions

_NOT_OPTIONS = {"func", "bench_verb", "json"}


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers(dest="command"))
    return parser.parse_args(["bench", *argv])


def test_run_flags_become_run_options(tmp_path: Path) -> None:
    body = tmp_path / "x.bin"
    args = _parse("run", "--url", "http://h:1", "--model", "m", "--model-version", "2",
                  "-c", "4", "--duration", "3", "--warmup", "0", "--timeout", "2", "--procs",
                  "2", "--max-batch-delay", "5", "--input", str(body))  # fmt: skip
    assert set(vars(args)) - _NOT_OPTIONS - {"command"} <= set(RunOptions.model_fields)
    options = cli._options(RunOptions, args)
    assert (options.version, options.concurrency, options.duration_s) == ("2", 4, 3.0)
    assert (options.warmup_s, options.timeout_s, options.processes) == (0.0, 2.0, 2)
    assert options.max_batch_delay_ms == 5.0 and options.inputs == (body,)


def test_sla_flags_become_sla_options(tmp_path: Path) -> None:
    args = _parse("sla", "--archive", "a.mar", "--input", "x.png", "--sla-p99-ms", "50",
                  "--batch-sizes", "1,4", "--no-prune", "--out", str(tmp_path), "--step", "1",
                  "--probe", "0.5", "--step-warmup", "0", "--config-warmup", "0")  # fmt: skip
    assert set(vars(args)) - _NOT_OPTIONS - {"command"} <= set(SlaOptions.model_fields)
    options = cli._options(SlaOptions, args)
    assert options.prune is False and options.out_dir == tmp_path
    assert (options.step_s, options.probe_s, options.step_warmup_s) == (1.0, 0.5, 0.0)
    assert options.config_warmup_s == 0.0 and options.batch_sizes == (1, 4)
    assert _parse("sla", "--archive", "a", "--input", "x", "--sla-p99-ms", "1").prune is True
