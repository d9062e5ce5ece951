#!/usr/bin/env bash
# Set up (if needed) and run the whole test suite. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# checkov (tests/deploy's security scan) pins packaging<24, which pytest refuses: it gets its own
# venv. Best effort: without it that one test skips and says how to install it.
if [ ! -x .venv-checkov/bin/checkov ] || [ deploy/requirements-lint.txt -nt .venv-checkov/.installed ]; then
  if "${PYTHON:-python3}" -m venv .venv-checkov \
     && .venv-checkov/bin/pip install --quiet -r deploy/requirements-lint.txt; then
    touch .venv-checkov/.installed
  else
    echo "setup: checkov not installed (tests/deploy/test_lint.py::test_checkov will skip)" >&2
  fi
fi
# Two test processes (pytest-xdist), each taking whole files so that a module's live server and
# its tests stay in one process; most tests wait on servers and workers. Arguments after these
# win: `-n 0` runs them in one process.
exec .venv/bin/python -m pytest -n "${TORCHBAY_TEST_PROCESSES:-2}" --dist loadfile "$@"
