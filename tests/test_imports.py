"""The packer stays free of torch with every format registered: spawned shard tasks start fast."""

from __future__ import annotations

import subprocess
import sys


def test_packer_imports_no_torch() -> None:
    code = "import sys, readers, packer.cli, packer.writers, packer.engines.local; print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"
