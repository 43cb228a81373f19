#!/usr/bin/env bash
# The browser tests' Chromium (tests/browser.py drives /usr/bin/chromium with Playwright's bundled driver;
# no `playwright install`, no browser download). Installs Debian's chromium when it is missing; idempotent
# and quiet. Where apt is unavailable it says so, and the tests marked `browser` skip with that reason.
set -euo pipefail
if command -v chromium >/dev/null 2>&1; then
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "==> no chromium and no apt-get: the browser tests will be skipped (install a chromium at /usr/bin/chromium)" >&2
  exit 0
fi
SUDO=""
if [ "$(id -u)" != 0 ]; then
  if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    SUDO="sudo -n"
  else
    echo "==> no chromium, and apt-get needs root (no password-less sudo): the browser tests will be skipped" >&2
    exit 0
  fi
fi
echo "==> installing Debian's chromium for the browser tests"
LOG=$(mktemp)
if ! { $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >"$LOG" 2>&1 \
  || { $SUDO apt-get update -q >>"$LOG" 2>&1 \
    && $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >>"$LOG" 2>&1; }; }; then
  tail -n 20 "$LOG" >&2
  echo "==> apt-get could not install chromium (log above): the browser tests will be skipped" >&2
fi
rm -f "$LOG"
