#!/usr/bin/env bash
# Run the lint step and the tests. `make test` (and CI) runs the whole suite, fast and slow, and prints
# the 25 slowest tests; `make test-fast` (TIER=fast) runs the tests not marked slow or vllm, for the
# edit loop (a few minutes). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
bash scripts/chromium.sh  # the browser tests' Chromium (Debian's), when missing
bash scripts/lint.sh
if [ "${TIER:-full}" = fast ]; then
  # the fuzz campaigns at a tenth of their size (2,500 bodies per entry point in the full suite)
  export FUZZ_EXAMPLES="${FUZZ_EXAMPLES:-250}"
  exec .venv/bin/python -m pytest -m "not slow and not vllm" --durations=10 "$@"
fi
exec .venv/bin/python -m pytest --durations=25 "$@"
