#!/usr/bin/env bash
# Create .venv (if missing) and install torchbay into it: with its dev extra (everything the test
# suite runs), or with --demo only what the digits demo runs (the demo extra: scikit-learn).
# torch: installs torch==2.13.0 only where no torch is importable, so a user's own CUDA or CPU
# build is never replaced (pyproject takes a range that any 2.x build satisfies).
set -euo pipefail
cd "$(dirname "$0")/.."
extra=dev
check="import torchbay, pytest, sklearn"
case "${1:-}" in
  --demo) extra=demo check="import torchbay, sklearn" ;;
  "") ;;
  *) echo "usage: scripts/setup.sh [--demo]" >&2; exit 2 ;;
esac
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
if ! .venv/bin/python -c "import torch" >/dev/null 2>&1; then
  .venv/bin/pip install --quiet "torch==2.13.0"
fi
# Installed: the extra's packages import, and pyproject.toml is older than the marker of an
# install that covers them (the dev extra holds the demo's packages too).
installed() {
  .venv/bin/python -c "$check" >/dev/null 2>&1 || return 1
  for marker in "$@"; do
    if [ -e "$marker" ] && ! [ pyproject.toml -nt "$marker" ]; then return 0; fi
  done
  return 1
}
if [ $extra = dev ]; then
  markers=(.venv/.torchbay-installed)
else
  markers=(.venv/.torchbay-demo .venv/.torchbay-installed)
fi
if ! installed "${markers[@]}"; then
  # The torch that is there stays: a dependency that asks for a newer one fails to install
  # rather than pulling several GB of CUDA packages.
  .venv/bin/python -c "import torch; print('torch==' + torch.__version__)" > .venv/constraints.txt
  .venv/bin/pip install --quiet -c .venv/constraints.txt -e ".[$extra]"
  touch "${markers[0]}"
fi
