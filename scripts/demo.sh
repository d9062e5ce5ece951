#!/usr/bin/env bash
# Set up (if needed), train and archive the digits example, serve it, and ask for a prediction.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python examples/digits/demo.py "$@"
