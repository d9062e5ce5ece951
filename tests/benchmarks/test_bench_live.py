"""``bench run`` and ``bench sla`` against a real ``torchbay serve`` with the tiny model.

Short runs (a few hundred requests, sub-second steps): these check behaviour (every request
answered and counted on both sides, settings applied live, report files well-formed, --apply
rewrites a verifiable archive), never speed.
"""

from __future__ import annotations

import csv
import json
import re
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from PIL import Image

from torchbay.archiver.extract import extract_archive
from torchbay.archiver.manifest import read_manifest
from torchbay.benchmarks import runner
from torchbay.benchmarks.apply import apply_settings
from torchbay.benchmarks.bench import RunOptions, format_report, run_bench
from torchbay.benchmarks.errors import BenchError
from torchbay.benchmarks.managed import Endpoints, ManagedServer
from torchbay.benchmarks.scenarios import Batching
from torchbay.benchmarks.sla import SlaOptions, run_sla
from torchbay.cli import main

pytestmark = pytest.mark.timeout(120)


def read_config(archive: Path, work: Path) -> dict:
    """The archive's model-config.yaml as a dict ({} when it has none), hashes checked."""
    name = extract_archive(archive, work).model.config_file
    return (yaml.safe_load((work / name).read_text()) or {}) if name else {}


@pytest.fixture(scope="module")
def server(
    tiny: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Endpoints, Path]]:
    run_dir = tmp_path_factory.mktemp("tb-serve")
    managed = ManagedServer.torchbay(tiny[0], run_dir)
    endpoints = managed.start()
    try:
        yield endpoints, run_dir / "key_file.json"
    finally:
        managed.stop()
        assert managed.proc is not None and managed.proc.poll() is not None


def _url_options(endpoints: Endpoints, key_file: Path, body: Path, **load: object) -> RunOptions:
    h = endpoints.host
    return RunOptions(
        url=f"http://{h}:{endpoints.inference_port}",
        management_url=f"http://{h}:{endpoints.management_port}",
        metrics_url=f"http://{h}:{endpoints.metrics_port}",
        key_file=key_file,
        model="tiny",
        inputs=(body,),
        warmup_s=0.0,
        **load,
    )


def test_closed_loop_counts_match_the_servers_view(server, tiny) -> None:
    endpoints, key_file = server
    options = _url_options(
        endpoints, key_file, tiny[1], concurrency=4, requests=300, batch_size=4,
        max_batch_delay_ms=1.0,
    )  # fmt: skip
    report = run_bench(options)
    r = report.result
    assert r.statuses == {"200": 300}
    assert r.ok == r.sent == r.completed == 300
    assert r.latency.count == 300 and r.latency.p50_ms <= r.latency.p99_ms <= r.latency.max_ms
    assert report.settings["batchSize"] == 4 and report.settings["maxBatchDelay"] == 1.0
    assert report.server is not None
    assert report.server.requests == {"200": 300.0}
    assert 1.0 <= report.server.mean_batch_size <= 4.0
    assert "inference" in report.server.handler_mean_ms
    assert "p99.9" in format_report(report)


def test_open_loop_measures_from_the_schedule(server, tiny) -> None:
    endpoints, key_file = server
    options = _url_options(
        endpoints, key_file, tiny[1], rate=300.0, arrival="poisson", duration_s=1.0
    )
    report = run_bench(options)
    r = report.result
    assert r.mode == "open" and r.offered_rate == 300.0
    # The report says how the load was made (it said neither the arrivals nor the warm-up).
    assert report.as_dict()["load"]["arrival"] == "poisson" and report.load["warmup_s"] == 0.0
    assert "load: {'arrival': 'poisson', 'warmup_s': 0.0, 'duration_s': 1.0" in format_report(
        report
    )
    assert r.sent > 100
    # Every request is answered; a busy host may shed some with 503 (the queue bound): the
    # measurement must still account for each one.
    assert sum(r.statuses.values()) == r.sent and set(r.statuses) <= {"200", "503"}
    assert r.ok == r.statuses.get("200", 0) > 0
    assert r.lag.count == r.sent  # every request has a scheduled time and a lag
    # From the schedule: never shorter than from the actual send (late sends add their lag).
    assert r.latency.mean_ms >= r.service.mean_ms
    assert r.latency.max_ms >= r.service.max_ms
    assert r.window_s >= 1.0


def test_wrong_token_is_counted_as_401(server, tiny) -> None:
    endpoints, _ = server
    options = RunOptions(
        url=f"http://{endpoints.host}:{endpoints.inference_port}", model="tiny",
        token="not-the-key", inputs=(tiny[1],), concurrency=2, requests=20, warmup_s=0.0,
    )  # fmt: skip
    r = run_bench(options).result
    assert r.statuses == {"401": 20}
    assert r.ok == 0 and r.error_rate == 1.0


def test_cli_run_starts_its_own_server(tiny, capsys) -> None:
    code = main(
        [
            "bench",
            "run",
            "--archive",
            str(tiny[0]),
            "--input",
            str(tiny[1]),
            "-c",
            "2",
            "-n",
            "50",
            "--warmup",
            "0",
            "--batch-size",
            "2",
            "--json",
        ]
    )
    assert code == 0
    data = json.loads(capsys.readouterr().out)
    assert data["client"]["statuses"] == {"200": 50}
    assert data["settings"]["batchSize"] == 2
    assert data["server"]["requests"] == {"200": 50.0}


def test_sla_search_reports_and_apply(tiny, tmp_path) -> None:
    archive = tmp_path / "tiny.mar"
    shutil.copy(tiny[0], archive)
    options = SlaOptions(
        archive=archive, inputs=(tiny[1],), sla_p99_ms=200.0, batch_sizes=(1, 4),
        max_delays_ms=(1.0, 2.0), workers=(1,), step_s=0.4, step_warmup_s=0.1, probe_s=0.4,
        config_warmup_s=0.2, max_steps=3, repeats=1, min_requests=20, out_dir=tmp_path / "out",
        apply=True,
    )  # fmt: skip
    lines: list[str] = []
    result = run_sla(options, log=lines.append)
    progress = [line for line in lines if line.startswith("progress: ")]
    assert progress and all("elapsed" in x and "s left" in x for x in progress), lines
    # 3 probes + 3 searches (or skips), then 1 repeat of each configuration that met the SLA
    # (2 at most), 1 autopilot run and the autopilot's probe and search: the count ends where
    # it said it would.
    last = re.match(r"progress: (\d+)/(\d+) autopilot searched", progress[-1])
    assert last and last[1] == last[2] and last[2] in ("10", "11"), lines
    labels = {oc.label: oc for oc in result.outcomes}
    assert set(labels) == {"b1-d1-w1", "b1-d2-w1", "b4-d1-w1", "b4-d2-w1"}
    assert labels["b1-d2-w1"].status == "same-as"  # batch 1 never waits: not measured twice
    assert labels["b1-d2-w1"].steps == []
    assert {rep.label for rep in result.repeats} <= set(labels)

    out = options.out_dir
    report = (out / "report.md").read_text()
    assert "## How it was found" in report
    assert "cores" in report and "torch" in report
    # the autopilot (slaP99Ms = the SLA, ceilings b4 d2) measured beside the winner
    assert result.autopilot is not None and len(result.autopilot.p99_ms) == 1
    assert result.autopilot_state is not None and result.autopilot_state["targetP99Ms"] == 200.0
    assert result.autopilot_state["maxBatchSize"] == 4
    assert 1 <= result.autopilot_state["batchSize"] <= 4
    assert "- **Autopilot**: (slaP99Ms 200" in report and "| autopilot |" in report
    assert " changes up, " in report and "{'up'" not in report
    # ... and searched for its own highest rate within the SLA, like the static configurations
    searched = result.autopilot_search
    assert searched is not None and searched.capacity > 0 and searched.steps
    assert searched.config.batch_size == 4 and searched.status in ("searched", "infeasible")
    assert f"- autopilot's highest rate within the SLA: {searched.status}: " in report
    saved = json.loads((out / "result.json").read_text())["autopilot"]["search"]
    assert saved["status"] == searched.status and saved["best_rate"] == searched.best_rate
    with (out / "results.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    phases = {row["phase"] for row in rows}
    assert any(row["config"].startswith("autopilot ") for row in rows)
    assert {"probe", "ramp"} <= phases
    assert all(float(row["p99_ms"]) >= float(row["p50_ms"]) for row in rows if row["p99_ms"])
    for png in ("latency_vs_throughput.png", "best_throughput.png"):
        with Image.open(out / png) as img:
            img.verify()
            assert img.format == "PNG" and img.size[0] > 100
    if result.winner is None:  # the pick missed the SLA in its repeat (at its edge rate)
        assert "missed the SLA in at least one repeat" in result.note
        assert "No winner: " in report and not archive.with_name(archive.name + ".orig").exists()
        return
    assert f"**{result.winner.label}**" in report and result.winner.best_rate > 0
    assert json.loads((out / "result.json").read_text())["winner"] == result.winner.label

    # --apply: the winner is in model-config.yaml and the archive still passes its hash checks.
    config = read_config(archive, tmp_path / "config")
    w = result.winner.config
    assert config["batchSize"] == w.batch_size and config["maxBatchDelay"] == w.max_batch_delay_ms
    assert config["minWorkers"] == config["maxWorkers"] == 1
    extract_archive(archive, tmp_path / "check")
    assert read_manifest(archive).model.config_file == "model-config.yaml"


def _archive_with_config(tiny: tuple[Path, Path], out: Path, config_text: str) -> Path:
    """``out/tiny.mar``, packed by ``torchbay archive`` with ``config_text`` as its
    model-config.yaml."""
    config = out / "cfg" / "model-config.yaml"
    config.parent.mkdir()
    config.write_text(config_text)
    pt = tiny[0].parent.parent / "models" / "tiny.pt"
    cmd = [sys.executable, "-m", "torchbay", "archive", "--model-name", "tiny", "--version", "1.0",
           "--serialized-file", str(pt), "--handler", str(runner.HANDLER_FILE),
           "--config-file", str(config), "--export-path", str(out)]  # fmt: skip
    subprocess.run(cmd, check=True, capture_output=True)
    return out / "tiny.mar"


def test_apply_keeps_other_keys(tiny, tmp_path) -> None:
    config = "# ours\nresponseTimeout: 30\nbatchSize: 2\nhandler:\n  num_threads: 1\n"
    archive = _archive_with_config(tiny, tmp_path, config)
    original = archive.read_bytes()
    backup = apply_settings(archive, Batching(8, 5.0, 2))
    assert backup == tmp_path / "tiny.mar.orig" and backup.read_bytes() == original
    assert apply_settings(archive, Batching(4, 5.0, 1)) == tmp_path / "tiny.mar.orig.1"
    assert backup.read_bytes() == original  # the first original is never overwritten
    apply_settings(archive, Batching(8, 5.0, 2))
    assert read_config(archive, tmp_path / "config") == {
        "responseTimeout": 30, "batchSize": 8, "handler": {"num_threads": 1},
        "maxBatchDelay": 5, "minWorkers": 2, "maxWorkers": 2,
    }  # fmt: skip
    manifest = extract_archive(archive, tmp_path / "x")  # hashes checked
    assert manifest.model.config_file == "model-config.yaml"
    with zipfile.ZipFile(archive) as zf:
        assert zf.namelist().count("model-config.yaml") == 1


def _as_torch_model_archiver_packs(archive: Path, config_text: str) -> None:
    """``archive`` rewritten with ``config_text`` as its model-config.yaml and no torchbay hash
    record: what torch-model-archiver packs, as it checks no config (torchbay's archiver
    refuses one that is not a YAML mapping)."""
    with zipfile.ZipFile(archive) as zf:
        members = {name: zf.read(name) for name in zf.namelist()}
    manifest = json.loads(members["MAR-INF/MANIFEST.json"])
    manifest.pop("torchbay", None)
    members["MAR-INF/MANIFEST.json"] = json.dumps(manifest).encode()
    members["model-config.yaml"] = config_text.encode()
    with zipfile.ZipFile(archive, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)


def test_apply_refuses_a_config_that_is_not_a_mapping(tiny, tmp_path) -> None:
    """A model-config.yaml that is a list: a clear error, the archive untouched, no backup."""
    archive = _archive_with_config(tiny, tmp_path, "batchSize: 2\n")
    _as_torch_model_archiver_packs(archive, "- batchSize: 2\n")
    original = archive.read_bytes()
    with pytest.raises(BenchError, match=r"model-config\.yaml is not a YAML mapping"):
        apply_settings(archive, Batching(8, 5.0, 2))
    assert archive.read_bytes() == original
    assert not archive.with_name("tiny.mar.orig").exists()


def test_apply_that_cannot_write_keeps_the_report(tiny, tmp_path) -> None:
    """--apply whose archive cannot be rewritten (a read-only model store; here a name too long
    for the backup's suffix, which root cannot get past either): one clear error, the archive as
    it was, and the search's report written (it was lost, after the whole search, to a raw
    OSError traceback)."""
    archive = tmp_path / ("t" * 247 + ".mar")
    shutil.copy(tiny[0], archive)
    short = {"step_s": 0.3, "probe_s": 0.3, "step_warmup_s": 0.0, "config_warmup_s": 0.0}
    options = SlaOptions(
        archive=archive,
        inputs=(tiny[1],),
        sla_p99_ms=60_000.0,
        max_error_rate=1.0,
        max_steps=2,
        repeats=0,
        min_requests=5,
        out_dir=tmp_path / "out",
        apply=True,
        autopilot=False,
        **short,
    )
    with pytest.raises(BenchError, match=r"--apply: cannot keep the original beside it: .*long"):
        run_sla(options, log=lambda line: None)
    assert archive.read_bytes() == tiny[0].read_bytes()
    report = (options.out_dir / "report.md").read_text()
    assert "**b1-d5-w1**" in report and "applied to" not in report


def test_an_interrupted_sla_search_leaves_a_partial_report(tiny, tmp_path) -> None:
    """Ctrl-C (here: KeyboardInterrupt raised where the search logs its second configuration's
    search, as a Ctrl-C does at any point) left no report at all, however long the search had
    run. Now the configurations measured so far are written, the report saying it is partial."""

    searches: list[str] = []

    def interrupt(line: str) -> None:
        if line.startswith("searching "):
            searches.append(line.split()[1])
        if len(searches) == 2:
            raise KeyboardInterrupt

    short = {"step_s": 0.3, "probe_s": 0.3, "step_warmup_s": 0.0, "config_warmup_s": 0.0}
    options = SlaOptions(
        archive=tiny[0],
        inputs=(tiny[1],),
        sla_p99_ms=60_000.0,
        max_error_rate=1.0,
        batch_sizes=(1, 4),
        max_delays_ms=(1.0,),
        max_steps=2,
        min_requests=5,
        prune=False,
        out_dir=tmp_path / "out",
        **short,
    )
    with pytest.raises(KeyboardInterrupt):
        run_sla(options, log=interrupt)
    report = (options.out_dir / "report.md").read_text()
    assert "- INTERRUPTED: a partial search" in report and "- No winner: interrupted" in report
    saved = json.loads((options.out_dir / "result.json").read_text())
    assert saved["interrupted"] is True and saved["winner"] is None
    status = {c["config"]: c["status"] for c in saved["configurations"]}
    assert status == {searches[0]: "searched", searches[1]: "pending"}
