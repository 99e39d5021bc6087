#!/usr/bin/env bash
# Set up, make a small sample image folder, pack it into every format, read it back.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
cd "$ROOT"
DEMO="${DEMO_DIR:-$ROOT/demo-out}"
rm -rf "$DEMO"
"$PY" scripts/make_sample.py "$DEMO/images" --classes 4 --per-class 25
FORMATS=$("$PY" -c "from packer.writers import WRITERS; print(' '.join(WRITERS))")
OUTS=()
for fmt in $FORMATS; do
    echo "+ pack $fmt $DEMO/images $DEMO/$fmt --shard-size 40"
    pack "$fmt" "$DEMO/images" "$DEMO/$fmt" --shard-size 40 --quiet
    OUTS+=("$DEMO/$fmt")
done
echo "reading back:"
"$PY" scripts/demo_read.py "$DEMO/images" "${OUTS[@]}"
echo "demo done: outputs under $DEMO"
