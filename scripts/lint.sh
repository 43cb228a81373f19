#!/usr/bin/env bash
# The lint step: every static check, in one place. `make lint`, `make test` and `make test-fast` run it
# (after scripts/bootstrap.sh); a new checker goes here, once.
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/ruff check .
.venv/bin/ruff format --check .
# the product code's types (mypy.ini lists the packages and the strictness)
.venv/bin/mypy --config-file mypy.ini
# the documentation site: --strict fails on a broken link, anchor or a page missing from the nav
NO_MKDOCS_2_WARNING=1 .venv/bin/python -m mkdocs build --strict --quiet -d "${TMPDIR:-/tmp}/agentlake-site"
