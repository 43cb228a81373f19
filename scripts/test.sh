#!/usr/bin/env bash
# Run the whole test suite (fast and slow) plus ruff. Used by `make test` and CI.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
.venv/bin/ruff check .
.venv/bin/ruff format --check .
exec .venv/bin/python -m pytest "$@"
