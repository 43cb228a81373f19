#!/usr/bin/env bash
# Run the lint step and the tests. `make test` (and CI) runs the whole suite, fast and slow, and prints
# the 25 slowest tests; `make test-fast` (TIER=fast) runs the tests not marked slow or vllm, for the
# edit loop (a few minutes). Extra arguments go to pytest.
# Two workers (TEST_WORKERS): the tests that start or share heavy servers (vLLM, a stack) run in order on one
# (tests/conftest.py groups them), the others beside them; TEST_WORKERS=0 runs everything in this process.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
bash scripts/chromium.sh  # the browser tests' Chromium (Debian's), when missing
bash scripts/lint.sh
WORKERS=(-n "${TEST_WORKERS:-2}" --dist loadgroup)
if [ "${TIER:-full}" = fast ]; then
  # the fuzz campaigns at a tenth of their size (2,500 bodies per entry point in the full suite)
  export FUZZ_EXAMPLES="${FUZZ_EXAMPLES:-250}"
  exec .venv/bin/python -m pytest "${WORKERS[@]}" -m "not slow and not vllm" --durations=10 "$@"
fi
exec .venv/bin/python -m pytest "${WORKERS[@]}" --durations=25 "$@"
