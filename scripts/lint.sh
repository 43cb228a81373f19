#!/usr/bin/env bash
# The lint step: every static check, in one place. `make lint`, `make test` and `make test-fast` run it
# (after scripts/bootstrap.sh); a new checker (types, the docs build) goes here, once.
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/ruff check .
.venv/bin/ruff format --check .
