#!/usr/bin/env bash
# Set up .venv and run the whole test suite. Extra arguments go to pytest.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
cd "$ROOT"
exec "$PY" -m pytest "$@"
