#!/usr/bin/env bash
# scripts/bench_peers.py in a venv of its own (.venv-peers, git-ignored): our tree beside LitData and
# MosaicML Streaming. torch is installed first at the project's CPU version (an unpinned torch pulls a
# multi-GB CUDA build); both peers ask for torchvision, whose wheels here are CUDA builds of another
# torch, so each peer is installed without its dependencies and with the ones it imports by hand.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${PEERS_VENV:-$ROOT/.venv-peers}"
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip install --quiet --disable-pip-version-check)
# `import streaming` needs the torchvision stand-in bench_peers.py makes: only look for the packages here.
if ! "$VENV/bin/python" -c "import importlib.util as u, sys
sys.exit(not all(u.find_spec(m) for m in ('litdata', 'streaming', 'obstore', 'readers', 's3fs', 'moto')))"; then
    "${PIP[@]}" "torch==2.13.0"
    "${PIP[@]}" --no-deps "litdata==0.2.76" "mosaicml-streaming==0.13.0"
    # What the two import (MDS: numpy < 2.2, xxhash < 4; transformers for its DataLoader's batch types);
    # s3fs and its botocore as in the project's .venv, so our reader runs as it does there.
    "${PIP[@]}" "numpy<2.2" lightning-utilities filelock boto3 requests "urllib3>=1.26" obstore Brotli \
        "python-snappy<1" "xxhash<4" "zstd<2" tqdm "catalogue<3" "transformers<5" pillow \
        "s3fs==2026.9.0" "aiobotocore==3.10.0" "boto3==1.43.117" "moto[server]>=5.0"
    "${PIP[@]}" -e "$ROOT"
fi
PYTHONPATH="$ROOT:$ROOT/scripts" exec "$VENV/bin/python" "$ROOT/scripts/bench_peers.py" "$@"
