#!/usr/bin/env bash
# Set up (if needed, and only what the demo runs: setup.sh --demo), train and archive the digits
# example, serve it (every port a free one), and ask for a prediction.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --demo
exec .venv/bin/python examples/digits/demo.py "$@"
