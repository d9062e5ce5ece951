"""Model and handler code that would end the process while it loads: ``sys.exit()``, ``exit()``,
``os._exit()``, a ``SystemExit``, ``GeneratorExit`` or ``KeyboardInterrupt`` raised at import or
in ``initialize``. Inside :func:`exits_refused` each is a :class:`ProcessExit`, an ordinary
exception the loaders report as the file's failure to load (the worker's ``LoadFailed``, the
archiver's and ``torchbay verify``'s one line), where it ended the worker with a bare exit code
and the archiver or ``verify`` with no word, with exit status 0 for ``sys.exit(0)``.

A real Ctrl-C still stops the command: on the main thread the block notes a SIGINT itself;
elsewhere a ``KeyboardInterrupt`` is the code's own only where SIGINT is ignored (a worker).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any, NoReturn

from ..errors import handler_fault


class ProcessExit(Exception):
    """Loading code tried to end the process; ``repr`` says how (``SystemExit(0)``,
    ``os._exit(3) called``), as a loader's message shows an exception's repr."""

    def __repr__(self) -> str:
        return str(self)


def _refusing(real_exit: Callable[[int], NoReturn]) -> Callable[[int], NoReturn]:
    """``os._exit`` that raises on this thread of this process, and is ``real_exit`` anywhere
    else: in a child the code forked (multiprocessing's ends with ``os._exit``; raising there,
    the child went on as a second copy of the loading worker) and on its other threads."""
    pid, thread = os.getpid(), threading.get_ident()

    def _exit(code: int) -> NoReturn:
        if os.getpid() == pid and threading.get_ident() == thread:
            raise ProcessExit(f"os._exit({code!r}) called")
        real_exit(code)

    return _exit


@contextlib.contextmanager
def exits_refused() -> Iterator[None]:
    """Run loading code: what would end the process raises :class:`ProcessExit` instead."""
    ctrl_c, installed = _ctrl_c_note()
    real_exit = os._exit
    os._exit = _refusing(real_exit)
    try:
        yield
    except Exception:
        raise
    except KeyboardInterrupt as exc:
        the_codes = handler_fault(exc) if ctrl_c is None else not ctrl_c.seen
        if not the_codes:
            raise  # the user's Ctrl-C
        raise ProcessExit(repr(exc)) from exc
    except BaseException as exc:  # SystemExit, GeneratorExit, a BaseException of its own
        raise ProcessExit(repr(exc)) from exc
    finally:
        os._exit = real_exit
        if installed:
            signal.signal(signal.SIGINT, signal.default_int_handler)


class _CtrlC:
    """Notes a SIGINT, then raises KeyboardInterrupt as Python's default handler does."""

    seen = False

    def __call__(self, signum: int, frame: Any) -> None:
        self.seen = True
        raise KeyboardInterrupt


def _ctrl_c_note() -> tuple[_CtrlC | None, bool]:
    """The SIGINT note of this block (and whether it installed it): that of an enclosing block,
    or a new one where Python's default handler is installed, on the main thread (the only one
    that may set a handler); None where SIGINT is the process's own (ignored: a worker)."""
    current = signal.getsignal(signal.SIGINT)
    if isinstance(current, _CtrlC):
        return current, False
    if current is not signal.default_int_handler:
        return None, False
    if threading.current_thread() is not threading.main_thread():
        return None, False
    note = _CtrlC()
    signal.signal(signal.SIGINT, note)
    return note, True
