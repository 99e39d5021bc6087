"""Every ```python block of README.md and docs/*.md runs as written, so the docs cannot drift from
the code.

The convention: a block that cannot run here (it needs a bucket or videos, it is a line to add to a
table, a signature rather than a call) has the line `<!-- not run: REASON -->` just above its
fence; every other block runs. Blocks run in a folder where the names they use are packed
datasets made once per session: `out.lmdb` (the README's first pack, `pack lmdb ./images
out.lmdb`: photos of many sizes, stored as they are), `out.wds`, `out.h5`, and `OUT`, the pack
whose shard file the block opens (FORMAT.md's blocks). A block that makes a loader runs twice:
with DataLoader workers started by fork, and by spawn (which imports the script in each worker, as
it does a user's train.py on macOS). Each block runs as a script, in a process of its own.
"""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from imagefolders import make_image_folder

from packer.run.pipeline import pack
from packer.plan.options import PackOptions

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
NOT_RUN = re.compile(r"<!-- not run: (?P<reason>[^>]+?) -->\n$")
PACKS = {"out.lmdb": "lmdb", "out.wds": "wds", "out.h5": "hdf5"}
SAMPLES = 135
OUT_BY_SHARD = {"shard-000000.lmdb": "out.lmdb", "shard-000000.h5": "out.h5", "shard-000000.tar": "out.wds",
                "shard-000000.packidx": "out.wds"}


@dataclass(frozen=True)
class Block:
    path: Path
    line: int
    code: str
    not_run: str | None

    @property
    def name(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"

    @property
    def makes_a_loader(self) -> bool:
        return "make_loader(" in self.code or "DataLoader(" in self.code


def python_blocks() -> list[Block]:
    blocks = []
    for path in DOCS:
        text = path.read_text(encoding="utf-8")
        for match in re.finditer(r"^```python\n(.*?)^```", text, re.S | re.M):
            before = text[:match.start()]
            marker = NOT_RUN.search(before[before.rfind("\n", 0, len(before) - 1) + 1:])
            blocks.append(Block(path, before.count("\n") + 1, match.group(1), marker and marker.group("reason")))
    return blocks


RUN = [block for block in python_blocks() if block.not_run is None]


@pytest.fixture(scope="session")
def doc_packs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder of 135 seeded photos of 16..64 pixels a side in 4 classes, packed once per format."""
    root = tmp_path_factory.mktemp("doc-packs")
    assert len(make_image_folder(root / "images", classes=4, per_class=33)) == SAMPLES
    for name, fmt in PACKS.items():
        pack(root / "images", root / name, PackOptions(format=fmt))
    return root


def run_folder(block: Block, packs: Path, tmp_path: Path) -> Path:
    """tmp_path with the session's packs under the names the block uses."""
    for name in PACKS:
        (tmp_path / name).symlink_to(packs / name)
    outs = {out for shard, out in OUT_BY_SHARD.items() if shard in block.code}
    assert len(outs) <= 1, f"{block.name} opens shards of two formats as OUT"
    if outs:
        (tmp_path / "OUT").symlink_to(packs / outs.pop())
    return tmp_path


def test_the_blocks_are_found_and_each_one_not_run_says_why() -> None:
    blocks = python_blocks()
    readme = [block for block in blocks if block.path.name == "README.md"]
    assert len(readme) == 2 and all(block.not_run is None for block in readme)
    assert any("readers.make_loader(" in block.code and "loss.backward()" in block.code for block in readme)
    assert len(RUN) >= 12 and all(block.not_run.strip() for block in blocks if block.not_run is not None)


REPORT = """
if __name__ == "__main__":  # added by the test: what the block left, for it to check
    for _name in ("ds", "hf"):
        if _name in globals():
            print(_name, len(globals()[_name]))
    if "sample" in globals():
        print("sample", sample["__key__"])
"""


def run_script(block: Block, folder: Path, start_method: str) -> list[str]:
    """The block's output lines, run as a script (`python block.py`) in `folder` with DataLoader
    workers started by `start_method`."""
    script = folder / "block.py"
    script.write_text(block.code + REPORT, encoding="utf-8")
    launch = (f"import multiprocessing, runpy; multiprocessing.set_start_method({start_method!r}); "
              "runpy.run_path('block.py', run_name='__main__')")  # __main__ is block.py, for spawn to import
    result = subprocess.run([sys.executable, "-c", launch], cwd=folder, capture_output=True, text=True, timeout=150)
    assert result.returncode == 0, f"{block.name} with {start_method}:\n{result.stderr[-3000:]}"
    return result.stdout.splitlines()


@pytest.mark.parametrize("block", RUN, ids=lambda block: block.name)
def test_block_runs(block: Block, doc_packs: Path, tmp_path: Path) -> None:
    """Each block in a process of its own, as a user runs it (py-lmdb opens a file once per process)."""
    folder = run_folder(block, doc_packs, tmp_path)
    for start_method in ("fork", "spawn") if block.makes_a_loader else ("fork",):
        lines = run_script(block, folder, start_method)
        for name in ("ds", "hf"):
            if re.search(rf"^{name} = ", block.code, re.M):
                assert f"{name} {SAMPLES}" in lines
        if re.search(r"^sample = ", block.code, re.M):
            assert "sample 000000_0000000000" in lines


def test_the_readme_stays_under_250_lines() -> None:
    assert len((ROOT / "README.md").read_text(encoding="utf-8").splitlines()) < 250
