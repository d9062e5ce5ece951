"""``bench sla``'s autopilot run: after the static search, the same model served with
``slaP99Ms`` = the SLA and the largest searched batch size and delay as the autopilot's ceilings
(server/serving/autopilot.py), measured at the winner's rate as the repeats are, then searched as
a static configuration is: the figure to set beside the winner's best rate. It needs a fresh
server: the SLA target comes from the ``models={...}`` entry of a config.properties.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torchbay.benchmarks.loadgen import LoadGenerator
from torchbay.benchmarks.managed import Endpoints, ManagedServer
from torchbay.benchmarks.report import Eta
from torchbay.benchmarks.scenarios import Batching, models_json
from torchbay.benchmarks.sla_model import Outcome, Repeat, SlaOptions, SlaResult

AUTOPILOT = "autopilot"
SEARCH_UNITS = 2  # progress units of one autopilot run beyond its repeats: probe and search


def ceilings(options: SlaOptions, winner: Outcome) -> Batching:
    """The autopilot's maxima: the largest searched batch and delay; the winner's workers."""
    return Batching(max(options.batch_sizes), max(options.max_delays_ms), winner.config.workers)


def write_config(options: SlaOptions, model: str, version: str | None, config: Batching) -> Path:
    """A config.properties whose ``models=`` entry sets the SLA target and the ceilings."""
    run_dir = options.out_dir / "autopilot"
    run_dir.mkdir(parents=True, exist_ok=True)
    models = models_json({model: config}, version or "1.0")
    models[model][version or "1.0"] |= {
        "marName": options.archive.name,
        "slaP99Ms": options.sla_p99_ms,
    }
    path = run_dir / "config.properties"
    path.write_text(f"models={json.dumps(models)}\n")
    return path


def run_autopilot(
    result: SlaResult,
    winner: Outcome,
    progress: Eta,
    log: Callable[[str], None],
    make_search: Callable[[Endpoints, LoadGenerator], Any],
) -> None:
    """Measure the autopilot at the winner's rate ``max(1, repeats)`` times (``result.autopilot``,
    labelled ``autopilot``), keep its describe-model state after them, then search its highest
    rate within the SLA (``result.autopilot_search``). ``make_search`` builds sla._Search on the
    new server."""
    options, model = result.options, result.model
    config = ceilings(options, winner)
    props = write_config(options, model, result.version, config)
    log(
        f"autopilot: p99 target {options.sla_p99_ms:g} ms, ceilings batch {config.batch_size}, "
        f"delay {config.max_batch_delay_ms:g} ms, {config.workers} worker(s), "
        f"at {winner.best_rate:.1f} req/s"
    )
    server = ManagedServer.torchbay(
        options.archive,
        options.out_dir / "autopilot" / "server",
        name=model,
        extra_args=("--ts-config", str(props.resolve())),
    )
    steps = []
    with server as endpoints, LoadGenerator(options.processes) as gen:
        search = make_search(endpoints, gen)
        for _ in range(max(1, options.repeats)):
            steps.append(search.measure(config, AUTOPILOT, winner.best_rate))
            progress.tick(AUTOPILOT)
        result.autopilot_state = search.mgmt.describe(model, None).get("autopilot")
        searched = result.autopilot_search = Outcome(config)
        search.probe(searched)
        progress.tick(f"{AUTOPILOT} probed")
        search.search(searched)
        progress.tick(f"{AUTOPILOT} searched")
        log(f"autopilot: {searched.status}: {searched.why}")
    result.autopilot = Repeat.of(AUTOPILOT, winner.best_rate, steps)
