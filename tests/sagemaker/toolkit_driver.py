"""SageMaker's own entry point, ``sagemaker_pytorch_serving_container.serving.main()``, run by
tests/sagemaker/test_toolkit_serving.py with ``torchserve`` on PATH being torchbay.

Two of the toolkit's module globals are pointed at the test, nothing else of it changes:
``TS_CONFIG_FILE`` (the toolkit writes /etc/sagemaker-ts.properties; a test writes its own
folder), and the process table it searches for the server: only processes in this driver's
working directory (the test's folder), because the host may run other TorchServes, which the
toolkit would count as "multiple ts model servers". Usage: ``python toolkit_driver.py <config>``.
"""

from __future__ import annotations

import contextlib
import os
import sys

import psutil


class _Here:
    """psutil, its ``process_iter`` limited to processes working in this driver's folder."""

    def __getattr__(self, name: str) -> object:
        return getattr(psutil, name)

    @staticmethod
    def process_iter() -> list[psutil.Process]:
        here, found = os.getcwd(), []
        for proc in psutil.process_iter():
            # gone, a zombie, or not ours to read; psutil 5.x lets a process that exits while
            # its cwd link is read escape as FileNotFoundError (another test's, on this host)
            with contextlib.suppress(psutil.Error, FileNotFoundError):
                if proc.cwd() == here:
                    found.append(proc)
        return found


def main() -> None:
    from sagemaker_pytorch_serving_container import serving, torchserve

    torchserve.TS_CONFIG_FILE = sys.argv[1]
    torchserve.psutil = _Here()
    serving.main()  # returns when the server it started exits (SIGTERM is passed on to it)


if __name__ == "__main__":
    main()
