"""``torchbay bench run|sla`` flags map one to one onto RunOptions / SlaOptions fields."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

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


def test_unset_flags_leave_the_options_defaults() -> None:
    """The flags are built from the fields (``bench.flag``): a flag not given is the field's
    default, and a field that is no flag is absent from the parsed flags."""
    runs = _parse("run", "--archive", "a.mar", "-r", "5", "--input", "x")
    sla = _parse("sla", "--archive", "a", "--input", "x", "--sla-p99-ms", "1")
    given = {"archive", "rate", "inputs", "sla_p99_ms"}
    for model, args in ((RunOptions, runs), (SlaOptions, sla)):
        options = cli._options(model, args)
        flags = set(vars(args)) - _NOT_OPTIONS - {"command"}
        assert {"headers", "run_dir", "ramp_factor", "precision"}.isdisjoint(flags)
        for name in flags - given:
            assert getattr(options, name) == model.model_fields[name].default, name


def test_the_torchbay_parser_imports_no_options_model() -> None:
    """Only the verb being parsed builds its flags: ``torchbay serve`` and the rest do not pay
    for pydantic and numpy at start."""
    code = (
        "import sys; from torchbay.cli import build_parser; build_parser(); "
        "print(sorted(m for m in ('pydantic', 'numpy') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_a_run_whose_every_request_failed_exits_1(tmp_path: Path) -> None:
    """A server that refuses the connections: the report is printed, and the exit status and
    one line say that it measured errors (it was 0, with a throughput of failures)."""
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    body = tmp_path / "x.bin"
    body.write_bytes(b"x")
    cmd = [sys.executable, "-m", "torchbay", "bench", "run", "--url", f"http://127.0.0.1:{port}"]
    cmd += ["--model", "m", "--input", str(body), "-c", "1", "--duration", "0.5", "--warmup", "0"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 1, out.stderr
    assert f"no request to http://127.0.0.1:{port}/predictions/m succeeded" in out.stderr
    assert "Traceback" not in out.stderr and "0 ok" in out.stdout


def test_an_infinite_rate_or_duration_is_refused(tmp_path: Path) -> None:
    """``--rate inf`` scheduled every request at once and hung the generator for ever (no report,
    no exit); ``--duration inf`` never ended. Both are refused before anything starts, as any
    non-finite number of the options is."""
    body = tmp_path / "x.bin"
    body.write_bytes(b"x")
    cmd = [sys.executable, "-m", "torchbay", "bench", "run", "--url", "http://127.0.0.1:9"]
    cmd += ["--model", "m", "--input", str(body), "--warmup", "0"]
    for load in (["--rate", "inf", "--duration", "1"], ["-c", "1", "--duration", "inf"]):
        out = subprocess.run([*cmd, *load], capture_output=True, text=True, timeout=30)
        assert out.returncode == 2, out.stderr
        assert "invalid configuration" in out.stderr and "finite number" in out.stderr
    args = _parse("sla", "--archive", "a", "--input", "x", "--sla-p99-ms", "5", "--step", "inf")
    with pytest.raises(ValidationError, match="finite number"):
        cli._options(SlaOptions, args)


def test_a_url_with_a_path_is_refused(tmp_path: Path) -> None:
    """``--url http://host:port/predictions/m`` (the URL curl is given) or a proxy's prefix: the
    path was dropped without a word and the load sent to ``/predictions/MODEL`` of the host."""
    body = tmp_path / "x.bin"
    body.write_bytes(b"x")
    cmd = [sys.executable, "-m", "torchbay", "bench", "run", "--model", "m", "--input", str(body)]
    for url in ("http://127.0.0.1:9/predictions/m", "http://127.0.0.1:9/prefix/"):
        load = ["--url", url, "-c", "1", "--duration", "0.5", "--warmup", "0"]
        out = subprocess.run([*cmd, *load], capture_output=True, text=True, timeout=60)
        assert out.returncode == 1 and "sent" not in out.stdout, out.stdout
        assert f"torchbay: error: {url!r}: give an http://host:port URL" in out.stderr
