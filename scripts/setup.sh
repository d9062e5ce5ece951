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
# checkov (tests/deploy's security scan) pins packaging<24, which pytest refuses: it gets its own
# venv. Best effort: without it that one test skips and says how to install it.
if [ ! -x .venv-checkov/bin/checkov ] || [ deploy/requirements-lint.txt -nt .venv-checkov/.installed ]; then
  if "$PYTHON" -m venv .venv-checkov \
     && .venv-checkov/bin/pip install --quiet -r deploy/requirements-lint.txt; then
    touch .venv-checkov/.installed
  else
    echo "setup: checkov not installed (tests/deploy/test_lint.py::test_checkov will skip)" >&2
  fi
fi
