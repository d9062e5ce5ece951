"""The worker template: ``python -m torchbay.server.worker.template --fd N``, a fork server.

Started once by the frontend (``serving/forkserver.py``) on one end of a ``SOCK_SEQPACKET``
socketpair, it imports torch, the handlers and the worker's code (the slowest part of a worker's
start: about a second) and then forks a worker on each request, in milliseconds, as Python's
``forkserver`` and gunicorn's ``preload`` do.

What it must never do before forking: run torch's thread pools (no ``get_num_threads``, no
parallel region: libgomp's pool does not survive a fork, and ``set_num_interop_threads`` fails
once the inter-op pool exists) or initialize CUDA (a forked child cannot use it). The child sets
its own threads, cores and device in ``main.serve``, as a spawned worker does.

Messages, one JSON object per packet; file descriptors ride along as SCM_RIGHTS:

* frontend -> template: ``{"op": "fork", "id", "env", "log_format"}`` with the worker's end of
  its socketpair, then the frontend's stdout and stderr: the worker writes where a spawned one
  would (the frontend's WorkerOutput pipe), whatever the template was started with;
* template -> frontend: ``{"op": "ready"}`` once the imports are done; ``{"op": "forked", "id",
  "pid"}`` with a pidfd of the child (so the frontend can signal and watch a process that is not
  its own child, without a pid that could be reused); ``{"op": "error", "id", "error"}`` when
  ``fork`` failed; ``{"op": "exit", "pid", "code"}`` when the template reaped a child (the code as
  ``Popen.returncode`` reads: negative for a signal).

EOF on its socket (the frontend closed it or died) ends the template; the workers it forked live
on in their own sessions and exit on their own socket's EOF.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import selectors
import signal
import socket
import sys

from torchbay.server.serving.spawning import end_group

log = logging.getLogger("torchbay.template")

MAX_PACKET = 1 << 20  # a fork request carries the worker's whole environment
MAX_FDS = 3  # the worker's socket, its stdout and its stderr


def _send(ctl: socket.socket, message: dict, fds: list[int] | None = None) -> None:
    socket.send_fds(ctl, [json.dumps(message).encode()], fds or [])


def _child(request: dict, fds: list[int], inherited: list[int]) -> int:
    """In the forked child: become a worker on ``fds[0]`` writing to ``fds[1:]`` (its stdout and
    stderr, when given); its exit code."""
    from torchbay.server.worker import main
    from torchbay.server.worker.worker_logs import configure_logging

    for other in inherited:  # the template's socket, selector and its other children's pidfds
        os.close(other)
    for target, fd in zip((1, 2), fds[1:], strict=False):
        os.dup2(fd, target)
        os.close(fd)
    os.setsid()  # own session, as a spawned worker: the frontend stops it, not a signal
    # The worker's environment, before anything of the worker reads it. What was read when the
    # template started (the allocator's, OpenMP's) stays the template's: the frontend forks only
    # when those are the same (forkserver.frozen_env).
    os.environ.clear()
    os.environ.update(request["env"])
    if "numpy" in sys.modules:  # numpy seeded its global generator at import: one per worker
        sys.modules["numpy"].random.seed()
    configure_logging("INFO", request.get("log_format", "text"))
    return main.run(socket.socket(fileno=fds[0]))


def _fork(request: dict, fds: list[int], inherited: list[int]) -> int:
    """Fork a worker on ``fds`` (:func:`_child`); its pid (in the template)."""
    from torchbay.server.worker.exits import exit_now, flush_stdio  # (the template has them)

    flush_stdio()  # else the child inherits, and later writes, a copy of what is buffered
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            code = _child(request, fds, inherited)
        except BaseException:
            log.exception("forked worker failed")
        finally:
            exit_now(code)  # atexit hooks (logging's flush) run; no interpreter teardown
    for fd in fds:
        os.close(fd)
    return pid


class Template:
    """The template's loop: fork requests from the frontend, exits of its children."""

    def __init__(self, ctl: socket.socket) -> None:
        self.ctl = ctl
        self.selector = selectors.DefaultSelector()
        self.selector.register(ctl, selectors.EVENT_READ)
        self.children: dict[int, int] = {}  # pidfd -> pid

    def serve(self) -> int:
        _send(self.ctl, {"op": "ready", "pid": os.getpid()})
        while True:
            for key, _ in self.selector.select():
                if key.fileobj is self.ctl:
                    if not self._request():
                        return 0
                else:
                    self._reap(key.fd)

    def _request(self) -> bool:
        """Serve one request; False at EOF."""
        data, fds, _, _ = socket.recv_fds(self.ctl, MAX_PACKET, MAX_FDS)
        if not data:
            return False
        request = json.loads(data)
        if request.get("op") != "fork" or len(fds) not in (1, 3):
            log.error("unexpected request %r; ignored", request.get("op"))
            for fd in fds:
                os.close(fd)
            return True
        inherited = [self.ctl.fileno(), *self._selector_fd(), *self.children]
        try:
            pid = _fork(request, fds, inherited)
        except OSError as exc:  # EAGAIN, ENOMEM: the frontend spawns instead
            for fd in fds:
                os.close(fd)
            _send(self.ctl, {"op": "error", "id": request["id"], "error": repr(exc)})
            return True
        pidfd = os.pidfd_open(pid)  # not reaped before it is registered: the pid is still ours
        self.children[pidfd] = pid
        self.selector.register(pidfd, selectors.EVENT_READ)
        _send(self.ctl, {"op": "forked", "id": request["id"], "pid": pid}, [pidfd])
        return True

    def _selector_fd(self) -> list[int]:
        fileno = getattr(self.selector, "fileno", None)  # epoll's; select() has none
        return [fileno()] if fileno is not None else []

    def _reap(self, pidfd: int) -> None:
        pid = self.children.pop(pidfd)
        self.selector.unregister(pidfd)
        os.close(pidfd)
        end_group(pid)  # exited, not reaped yet: its handler's children go with it
        _, status = os.waitpid(pid, 0)
        _send(self.ctl, {"op": "exit", "pid": pid, "code": os.waitstatus_to_exitcode(status)})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="torchbay-worker-template")
    parser.add_argument("--fd", type=int, required=True, help="inherited SOCK_SEQPACKET socket")
    parser.add_argument("--log-format", choices=("text", "json"), default="text")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # as a worker: the frontend decides
    from torchbay.server.worker.worker_logs import configure_logging

    configure_logging("INFO", args.log_format)  # its lines are a worker's
    # What a worker imports before its Load (main.serve), imported once here. Nothing of torch
    # runs: no thread pool, no CUDA.
    import torch  # noqa: F401

    from torchbay.handlers.runtime.service import load_service  # noqa: F401

    ctl = socket.socket(fileno=args.fd)
    try:
        return Template(ctl).serve()
    except (BrokenPipeError, ConnectionResetError):
        return 0
    finally:
        ctl.close()


if __name__ == "__main__":
    from torchbay.server.worker.exits import exit_now

    exit_now(main())  # EOF ended it: no 2-3 s interpreter teardown with torch imported
