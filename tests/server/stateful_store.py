"""TorchServe's stateful example packed by our archiver, as the sequence tests serve it
(test_sequences*_live.py, test_sequence_headers_live.py, test_multiplex.py): its handler and
model.py unchanged (tests/third_party), its LRU beside it (our stand-in, tests/data)."""

from __future__ import annotations

import importlib.util
import threading
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc
import torch

from torchbay.archiver.package import ArchiveOptions, package

from .conftest import running

# TorchServe's stateful example, unchanged (third_party), and our records of TorchServe's
# answers to it beside our lru.py stand-in (data).
EXAMPLE = Path(__file__).resolve().parents[1] / "third_party" / "torchserve" / "stateful"
RECORDS = Path(__file__).resolve().parents[1] / "data" / "torchserve" / "stateful"
SEQ_HEADER = "ts_request_sequence_id"
NUMBERS = [3, 1, 4, 1, 5, 9, 2, 6]
CORRID_INT32 = """sequence_batching:
  control_input:
    - name: CORRID
      control: [{kind: CONTROL_SEQUENCE_CORRID, data_type: TYPE_INT32}]
"""


def archive(
    root: Path, work: Path, name: str, config: Path, example: str = "sequence_batching"
) -> None:
    spec = importlib.util.spec_from_file_location("stateful_model", EXAMPLE / "model.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    torch.manual_seed(0)
    torch.save(module.Net().state_dict(), work / "model_cnn.pt")
    package(
        ArchiveOptions(
            model_name=name,
            version="1.0",
            model_file=EXAMPLE / "model.py",
            serialized_file=work / "model_cnn.pt",
            handler=str(EXAMPLE / example / "stateful_handler.py"),
            extra_files=(str(RECORDS / "lru.py"),),
            config_file=config,
            export_path=root,
        )
    )


def served(root: Path, **overrides: Any) -> Iterator[SimpleNamespace]:
    """The live server of these tests, every model in ``root`` loaded (``overrides``: its other
    settings), and a gRPC channel to its inference port; both closed when the generator ends."""
    with running(root, load_models=["all"], **overrides) as live:
        port = live.server.state.ports.grpc_inference
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield SimpleNamespace(live=live, url=live.url, channel=channel)


def interleaved(count: int, run_one) -> dict[int, list]:
    """``run_one(i)`` for ``count`` sequences at once, in threads; {i: its answers}."""
    results: dict[int, list] = {}
    errors: list[BaseException] = []

    def target(i: int) -> None:
        try:
            results[i] = run_one(i)
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=target, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    return results
