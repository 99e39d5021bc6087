"""The format table resolves, and the packer stays free of torch with every format loaded:
spawned shard tasks start fast, and layouts are shared without torch."""

from __future__ import annotations

import subprocess
import sys

import pytest

from packer.writers import WRITERS
from readers.formats import ALIASES, FORMATS


def test_packer_imports_no_torch_with_every_writer_and_layout_loaded() -> None:
    code = (
        "import importlib, sys, readers, packer.cli, packer.engines.local\n"
        "from readers.formats import FORMATS\n"
        "from packer.writers import WRITERS\n"
        "for name, spec in FORMATS.items():\n"
        "    importlib.import_module(spec.layout)\n"
        "    assert WRITERS[name].format == name, name\n"
        "print('torch' in sys.modules)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"


@pytest.mark.parametrize("name", FORMATS)
def test_every_format_resolves_to_its_writer_and_dataset(name: str) -> None:
    import readers

    assert WRITERS[name].format == name
    assert readers.DATASETS[name].format == name
    for alias in FORMATS[name].aliases:
        assert ALIASES[alias] == name and WRITERS[alias] is WRITERS[name]


def test_decode_modes_listed_in_the_contract_are_the_decoders() -> None:
    from readers.decode import _DECODERS
    from readers.manifest import DECODE_MODES

    assert tuple(_DECODERS) == DECODE_MODES
