#!/usr/bin/env bash
# Create .venv (if missing) and install torchbay with its dev extra into it.
# torch: installs torch==2.13.0 only where no torch is importable, so a user's own CUDA or CPU
# build is never replaced (pyproject takes a range that any 2.x build satisfies).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
if ! .venv/bin/python -c "import torch" >/dev/null 2>&1; then
  .venv/bin/pip install --quiet "torch==2.13.0"
fi
if ! .venv/bin/python -c "import torchbay, pytest, sklearn" >/dev/null 2>&1 \
   || [ pyproject.toml -nt .venv/.torchbay-installed ]; then
  .venv/bin/pip install --quiet -e ".[dev]"
  touch .venv/.torchbay-installed
fi
