"""The packer stays free of torch with every format registered: spawned shard tasks start fast."""

from __future__ import annotations

import subprocess
import sys


def test_packer_imports_no_torch() -> None:
    code = "import sys, readers, packer.cli, packer.writers, packer.engines.local; print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


def test_decode_modes_listed_in_the_contract_are_the_decoders() -> None:
    from readers.decode import _DECODERS
    from readers.manifest import DECODE_MODES

    assert tuple(_DECODERS) == DECODE_MODES
