#!/usr/bin/env bash
# timm and NVIDIA DALI (CPU) read a `pack wds` output as is: scripts/check_loaders.py checks every
# sample. Not in the test suite: it needs its own venv (.venv-loaders), because timm pulls
# torchvision, which here is only a CUDA build with its own torch (torch 2.14.1 + torchvision
# 0.29.1 from this machine's disk), and DALI's wheel (nvidia-dali-cuda120, whose CPU operators run
# without a GPU) is large. The project's .venv keeps its CPU torch. DALI_INSTALL_SECONDS bounds
# DALI's download; past it, timm is still checked and DALI is reported as not installed.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${LOADERS_VENV:-$ROOT/.venv-loaders}"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip install --quiet --disable-pip-version-check)
"${PIP[@]}" "torch==2.14.1" "torchvision==0.29.1" "timm==1.0.31" "webdataset>=1.0"
"${PIP[@]}" -e "$ROOT"
DALI=()
if ! "$VENV/bin/python" -c "import nvidia.dali" 2>/dev/null; then
    timeout "${DALI_INSTALL_SECONDS:-900}" "${PIP[@]}" "nvidia-dali-cuda120==2.4.0" || DALI=(--skip-dali)
fi
[ ${#DALI[@]} -eq 0 ] || echo "DALI: nvidia-dali-cuda120 could not be installed within ${DALI_INSTALL_SECONDS:-900} s; checking timm only"
# 60 ImageNet-sized (500x375) JPEGs and PNGs; THROUGHPUT_SECONDS > 0 also times DALI vs make_loader.
"$VENV/bin/python" "$ROOT/scripts/make_sample.py" "$WORK/src" --classes 3 --per-class "${PER_CLASS:-20}" >/dev/null
"$VENV/bin/pack" wds "$WORK/src" "$WORK/out" --shard-size 16 -q
"$VENV/bin/python" "$ROOT/scripts/check_loaders.py" "$WORK/out" "${DALI[@]}" --throughput "${THROUGHPUT_SECONDS:-0}"
