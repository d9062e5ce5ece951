"""TorchServe's own archivers (torch-model-archiver, torch-workflow-archiver), run as the tests
run them: as subprocesses, each with a temporary directory of its own.

Both stage an archive's files in ``$TMPDIR/<name>`` and remove that directory first, so two
runs that archive the same name at once on one host (another test suite beside this one) delete
each other's files. ``TMPDIR`` moves that directory under the test's own."""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any


def run_archiver(command: list[str], **kwargs: Any) -> subprocess.CompletedProcess:
    """``subprocess.run(command, check=True, **kwargs)`` with a private ``TMPDIR``."""
    with tempfile.TemporaryDirectory(prefix="ts-archiver-") as private:
        env = {**os.environ, "TMPDIR": str(Path(private))}
        return subprocess.run(command, check=True, env=env, **kwargs)
