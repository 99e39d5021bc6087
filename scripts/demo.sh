#!/usr/bin/env bash
# Set up, make a small sample image folder, pack it into every format, read it back.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
cd "$ROOT"
DEMO="${DEMO_DIR:-$ROOT/demo-out}"
rm -rf "$DEMO"
"$PY" scripts/make_sample.py "$DEMO/images" --classes 4 --per-class 25
FORMATS=$("$PY" -c "from packer.write.writers import WRITERS; print(' '.join(WRITERS))")
OUTS=()
for fmt in $FORMATS; do
    echo "+ pack $fmt $DEMO/images $DEMO/$fmt --shard-size 40"
    pack "$fmt" "$DEMO/images" "$DEMO/$fmt" --shard-size 40 --quiet
    OUTS+=("$DEMO/$fmt")
done
echo "+ pack lmdb $DEMO/images $DEMO/lmdb-raw --store raw --resize 64 --center-crop 64 --shard-size 25   # pre-decoded pixels"
pack lmdb "$DEMO/images" "$DEMO/lmdb-raw" --store raw --resize 64 --center-crop 64 --shard-size 25 --quiet
for out in "${OUTS[@]}" "$DEMO/lmdb-raw"; do
    pack verify "$out" --quiet
done
echo "reading back:"
"$PY" scripts/demo_read.py "$DEMO/images" "${OUTS[@]}"
"$PY" - "$DEMO/lmdb-raw" <<'PYTHON'
import sys
import readers
ds = readers.open_dataset(sys.argv[1], decode="tensor")
loader = readers.make_loader(ds, batch_size=16, seed=0, num_workers=2)
images, labels = next(iter(loader))
print(f"  lmdb-raw   make_loader: {len(loader)} batches per epoch; first batch {tuple(images.shape)} "
      f"{images.dtype}, labels {labels.tolist()}")
PYTHON
echo "demo done: outputs under $DEMO"
