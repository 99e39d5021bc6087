#!/usr/bin/env bash
# The test set-up, sourced by test.sh: the use set-up (setup.sh), then the test extras (moto,
# datasets, dask, ...) and the system packages some tests drive (test-packages.sh).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
"$PY" -m pip install --quiet --disable-pip-version-check -e "$ROOT[test,dask]"
bash "$ROOT/scripts/test-packages.sh"
