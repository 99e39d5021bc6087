#!/usr/bin/env bash
# The use set-up: create .venv if needed and install the project into it, for packing and reading.
# Sourced by demo.sh, and by setup-tests.sh (test.sh), which adds what the tests need.
# torch goes in first, pinned, when no torch is present: an unpinned torch pulls a newer CUDA build. On
# this project's machines the pin is a CPU build on local disk; elsewhere see README (CPU index).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
PYTHON_BIN="${PYTHON:-python3}"
if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON_BIN" -m venv "$VENV"
fi
PY="$VENV/bin/python"
if ! "$PY" -c "import torch" >/dev/null 2>&1; then
    "$PY" -m pip install --quiet --disable-pip-version-check "torch==2.13.0"
fi
"$PY" -m pip install --quiet --disable-pip-version-check -e "$ROOT"
export PATH="$VENV/bin:$PATH"
