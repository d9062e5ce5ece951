"""The worker process: ``python -m torchbay.server.worker --fd N``.

Spawned by the frontend with one end of a socketpair, or forked from the worker template
(``template.py``, the same ``run`` on the same socket). It reads a ``Load``, loads the
model through the same ``load_service`` that ``torchbay verify`` uses, answers ``Ready`` (or
``LoadFailed``), then serves ``Infer`` frames one at a time until ``Shutdown`` or EOF. This is the
only server module that imports torch (through the handlers).

Nothing a request carries ends the loop: ``Service.predict`` answers per request, and should it
raise anyway (a bug of ours), ``_predict`` answers every request of that batch with a 500 error
body and the worker keeps serving.

While a batch runs, a reader thread (``_Channel``) keeps reading the socket: a ``Cancel`` marks
its request cancelled at once (the handler's next streamed part for it raises, see
``handlers.streaming``), everything else waits for the serving loop. Streamed parts go out as
``Part`` frames from the handler's thread, before the batch's ``Result``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import inspect
import logging
import os
import queue
import signal
import socket
import threading
import time
from collections.abc import Callable

from torchbay.server.serving import protocol as p
from torchbay.server.serving import transport
from torchbay.server.serving.spill import SpillWriter
from torchbay.server.worker.exits import FRONTEND_GONE, exit_now
from torchbay.server.worker.worker_logs import configure_logging

log = logging.getLogger("torchbay.worker")


def _pin(load: p.Load) -> None:
    import torch

    # Inter-op 1 (the host budget counts intra-op threads only); before any parallel work, which
    # nothing has started yet (RuntimeError otherwise: then torch's default stays).
    with contextlib.suppress(RuntimeError):
        torch.set_num_interop_threads(1)
    torch.set_num_threads(max(1, load.num_threads))
    if load.cpu_affinity and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, load.cpu_affinity)


def _retune(message: p.Tune, started_on: set[int], keep_threads: bool) -> None:
    """Apply a ``Tune``: torch's intra-op threads (unless the handler set its own:
    ``keep_threads``), and the cores of every thread of the process (``None``: the cores it
    started with); a core that cannot be had leaves them as they are."""
    import torch

    if not keep_threads:
        torch.set_num_threads(max(1, message.num_threads))
    if started_on and hasattr(os, "sched_setaffinity"):
        cores = set(message.cpu_affinity or started_on)
        for tid in os.listdir("/proc/self/task"):
            with contextlib.suppress(OSError):
                os.sched_setaffinity(int(tid), cores)


def _to_wire(response: object, partial: bool = False) -> p.WireResponse:
    return p.WireResponse(
        status=response.status,  # type: ignore[attr-defined]
        body=response.body,  # type: ignore[attr-defined]
        content_type=response.content_type,  # type: ignore[attr-defined]
        headers=dict(response.headers),  # type: ignore[attr-defined]
        partial=partial,
    )


class _Channel:
    """The worker's socket while serving: a reader thread, the cancelled requests, and the
    ``handlers.runtime.streams.PartSink`` the Service sends its parts through."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.batch_id = 0
        self._inbox: queue.SimpleQueue[p.Message | BaseException | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        # One frame at a time on the socket: a handler's own thread may send a part while the
        # serving loop sends a Result (interleaved bytes would break the protocol).
        self._write_lock = threading.Lock()
        self._live: set[str] = set()  # request ids received and not answered yet
        self._cancelled: set[str] = set()
        threading.Thread(target=self._read, name="torchbay-reader", daemon=True).start()

    def _read(self) -> None:
        while True:
            try:
                message = transport.recv_message(self.sock)
            except (EOFError, OSError) as exc:
                if isinstance(exc, EOFError | ConnectionResetError):  # not the handler's close
                    FRONTEND_GONE.set()
                with self._lock:  # the frontend is gone: nobody reads any stream
                    self._cancelled |= self._live
                self._inbox.put(None)
                return
            except p.ProtocolError as exc:
                self._inbox.put(exc)
                return
            with self._lock:
                if isinstance(message, p.Cancel):
                    if message.request_id in self._live:
                        self._cancelled.add(message.request_id)
                    continue
                if isinstance(message, p.Infer):
                    self._live.update(r.request_id for r in message.requests)
            self._inbox.put(message)

    def next(self) -> p.Message | None:
        """The next message for the serving loop; None at EOF."""
        message = self._inbox.get()
        if isinstance(message, BaseException):
            raise message
        return message

    def done(self, message: p.Infer) -> None:
        with self._lock:
            for r in message.requests:
                self._live.discard(r.request_id)
                self._cancelled.discard(r.request_id)

    def cancelled(self, request_id: str) -> bool:
        with self._lock:
            return request_id in self._cancelled

    def send(self, request_id: str, response: object) -> None:
        """One streamed part (raises ProtocolError for a part too big to frame)."""
        part = p.Part(self.batch_id, request_id, _to_wire(response, partial=True))
        self.write(p.encode(part))

    def write(self, frame: bytes) -> None:
        """Send one whole frame."""
        with self._write_lock:
            self.sock.sendall(frame)


def _predict(service: object, message: p.Infer, limit: int = 0) -> p.Result:
    """The ``Result`` for one ``Infer``: exactly one response per request, whatever happens;
    one past ``limit`` bytes (``max_response_size``, 0: none) is that request's 500."""
    requests = message.requests
    try:
        predict = service.predict  # type: ignore[attr-defined]
        outcome = predict(requests)
        responses = [_to_wire(r) for r in outcome.responses]
        if len(responses) != len(requests):
            raise RuntimeError(f"{len(responses)} responses for {len(requests)} requests")
        responses = [_bounded(r, q, limit) for r, q in zip(responses, requests, strict=True)]
        given = (outcome.timings, outcome.metrics, getattr(outcome, "handled", None))
        return p.Result(message.batch_id, responses, *given)
    except Exception as exc:  # last resort: a worker death is never how an input error shows
        ids = [r.request_id for r in requests]
        log.error(
            "predict failed on batch %s (request ids %s)", message.batch_id, ids, exc_info=True
        )
        return p.Result(message.batch_id, [_failure(exc, r) for r in requests], {}, [])


def _bounded(response: p.WireResponse, request: p.WireRequest, limit: int) -> p.WireResponse:
    """``response``, or its 500 when its body is past ``limit`` bytes: answered here, not sent
    whole for the frontend to refuse (it read all of it, and a batch's frame past 2 GiB failed
    every request of the batch)."""
    size = len(response.body)
    if not limit or size <= limit:
        return response
    from torchbay.handlers.runtime.responses import error_response

    message = f"The model's response of {size} bytes exceeds the server's max_response_size of "
    message += f"{limit} bytes"
    log.error("request %s: %s; answered 500", request.request_id, message)
    return _to_wire(error_response(500, "HandlerFailed", message, request.protocol == "v2"))


def _frame(result: p.Result, message: p.Infer) -> bytes:
    """``result`` as a frame; one that cannot be framed (too big, unencodable) becomes 500s."""
    try:
        return p.encode(result)
    except (p.ProtocolError, TypeError, ValueError) as exc:
        log.error("cannot frame the result of batch %s", message.batch_id, exc_info=True)
        failed = [_failure(exc, r) for r in message.requests]
        return p.encode(p.Result(message.batch_id, failed, {}, []))


def _failure(exc: Exception, request: p.WireRequest) -> p.WireResponse:
    from torchbay.handlers.errors import failure_message
    from torchbay.handlers.runtime.responses import error_response

    message = failure_message(exc, [request.request_id])
    response = error_response(500, "InternalServerException", message, request.protocol == "v2")
    return _to_wire(response)


def _load_error_type(exc: BaseException) -> str:
    """The type a load failure is reported as: the error's own, unless the handler's load ran
    out of memory somewhere beneath it (Python's MemoryError, torch's OutOfMemoryError), which
    is named instead: the server answers that with 507, SageMaker's "unload and retry"."""
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, MemoryError) or type(cause).__name__ == "OutOfMemoryError":
            return type(cause).__name__
        cause = cause.__cause__
    return type(exc).__name__


def serve(sock: socket.socket) -> int:
    """Run the worker protocol on ``sock``. Returns the process exit code."""
    # Import torch and the handlers before the Load arrives: a worker spawned early (see
    # serving.handle.spawn_process) overlaps this, its slowest start-up step, with the frontend.
    import torch

    from torchbay.handlers.errors import scrub_message
    from torchbay.handlers.runtime.service import load_service

    try:
        load = transport.recv_message(sock)
    except EOFError:
        return 0  # a pre-warmed worker nobody needed
    if not isinstance(load, p.Load):
        raise p.ProtocolError(f"expected LOAD first, got {type(load).__name__}")
    started = time.perf_counter()
    started_on = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set()
    try:
        _pin(load)
        service = load_service(load.model_dir, **_service_options(load, load_service))
    except Exception as exc:  # report any load failure to the frontend, then exit
        log.error("loading %s failed", load.model_name, exc_info=True)
        # The reason reaches API answers (a registration's 500, describe's loadError): no
        # traceback or server path in it; this worker's log above has them.
        reason = scrub_message(str(exc) or repr(exc))
        transport.send_message(sock, p.LoadFailed(_load_error_type(exc), reason))
        return 1
    threads = torch.get_num_threads()
    own = threads != max(1, load.num_threads)  # the handler's initialize set its own
    if own:
        log.info("the handler set %d intra-op threads (given %d): kept", threads, load.num_threads)
    transport.send_message(
        sock,
        p.Ready(
            pid=os.getpid(),
            device=str(service.device),
            load_time_ms=(time.perf_counter() - started) * 1000,
            num_threads=threads,
            torch_version=torch.__version__,
            metrics=service.load_metrics or None,
            metrics_spill=_spill(service),
        ),
    )
    # Every batch on this thread, which ran the handler's initialize (as TorchServe's backend):
    # what a handler set there for later is per thread (torch's grad mode, signal handlers).
    return _serve_batches(sock, service, started_on, load.max_response_size, own)


def _spill(service: object) -> str:
    """The path of the metrics spill (serving.spill) the handler's ``context.metrics`` writes
    each record to from now on; "" when there is none (no such context, the file failed)."""
    metrics = getattr(getattr(service, "context", None), "metrics", None)
    if metrics is None:
        return ""
    try:
        metrics.spill = SpillWriter()
    except (OSError, ValueError) as exc:
        log.warning("no metrics spill (%s): a crash loses its batch's handler metrics", exc)
        return ""
    return metrics.spill.path


def _service_options(load: p.Load, load_service: Callable[..., object]) -> dict[str, object]:
    """The ``Load``'s fields that ``load_service`` takes, by name: the Load is the launch spec
    serialized, so a spec field the service reads reaches it without a line here (the rest are
    the worker's own: threads and pinning, ``_pin``; the response bound, ``_bounded``)."""
    accepted = inspect.signature(load_service).parameters
    return {
        f.name: getattr(load, f.name)
        for f in dataclasses.fields(load)
        if f.name in accepted and f.name != "model_dir"
    }


def _serve_batches(
    sock: socket.socket,
    service: object,
    started_on: set[int],
    limit: int,
    keep_threads: bool,
) -> int:
    """Serve ``Infer`` frames until ``Shutdown`` or EOF (the exit code)."""
    channel = _Channel(sock)
    service.part_sink = channel  # type: ignore[attr-defined]
    while True:
        message = channel.next()
        if message is None:
            return 0  # the frontend is gone
        if isinstance(message, p.Shutdown):
            return 0
        if isinstance(message, p.Tune):
            _retune(message, started_on, keep_threads)
            continue
        if isinstance(message, p.Regions):  # a CUDA region was unregistered: let its handle go
            from torchbay.handlers.runtime.shm import release_unnamed

            release_unnamed(message.cuda)
            continue
        if not isinstance(message, p.Infer):
            raise p.ProtocolError(f"unexpected {type(message).__name__} while serving")
        channel.batch_id = message.batch_id
        frame = _frame(_predict(service, message, limit), message)
        channel.done(message)
        channel.write(frame)


def run(sock: socket.socket) -> int:
    """Serve on ``sock`` until the frontend is done with it; the process's exit code."""
    try:
        return serve(sock)
    except p.ProtocolError:
        log.error("protocol error; exiting", exc_info=True)
        return 3
    except (BrokenPipeError, ConnectionResetError):
        return 0
    finally:
        sock.close()


def start(argv: list[str] | None = None) -> None:
    """A spawned worker: ``main``, then ``exit_now`` whatever it raised (the interpreter's
    teardown would wait for every non-daemon thread a handler left)."""
    code = 1
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's usage error
        code = exc.code if isinstance(exc.code, int) else 2
    except BaseException:
        log.exception("the worker failed")
    finally:
        exit_now(code)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="torchbay-worker")
    parser.add_argument("--fd", type=int, required=True, help="inherited socket file descriptor")
    parser.add_argument("--log-level", default="INFO")
    parser.add_argument("--log-format", choices=("text", "json"), default="text")
    args = parser.parse_args(argv)
    # Ctrl-C reaches the whole process group; the frontend decides when workers stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    configure_logging(args.log_level, args.log_format)
    return run(socket.socket(fileno=args.fd))
