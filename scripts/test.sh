#!/usr/bin/env bash
# Run the whole test suite (fast and slow) plus ruff and mypy. Used by `make test` and CI.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy --config-file mypy.ini  # the product code's types (mypy.ini lists the packages)
exec .venv/bin/python -m pytest "$@"
