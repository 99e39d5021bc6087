"""The format table resolves, and the packer stays free of torch with every format loaded:
spawned shard tasks start fast, and layouts are shared without torch."""

from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from packer.write.writers import WRITERS
from readers.formats import ALIASES, FORMATS

ROOT = Path(__file__).resolve().parents[1]


def test_packer_imports_no_torch_with_every_writer_and_layout_loaded() -> None:
    code = (
        "import importlib, sys, readers, packer.cli, packer.engines.local\n"
        "from readers.formats import FORMATS\n"
        "from packer.write.writers import WRITERS\n"
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


def imports_of(path: Path, package: str) -> set[str]:
    """The project modules a file imports, at any depth of its code (lazy imports count too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = importlib.util.resolve_name("." * node.level + (node.module or ""), package) if node.level \
                else node.module or ""
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def test_data_flows_one_way_with_no_import_cycle() -> None:
    """scan -> plan -> encode -> write -> manifest: no cycle among the project's modules, and the
    readers never import the packer. Registries name their entries as strings: no edge there."""
    modules = {}
    for path in sorted(ROOT.glob("packer/**/*.py")) + sorted(ROOT.glob("readers/**/*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        modules[name] = path
    graph = {
        name: {imported for imported in imports_of(path, name if path.name == "__init__.py" else name.rpartition(".")[0])
               if imported in modules and imported != name}
        for name, path in modules.items()
    }
    assert not [(name, edge) for name, edges in graph.items() if name.startswith("readers")
                for edge in edges if edge.startswith("packer")]
    done: set[str] = set()

    def visit(name: str, stack: list[str]) -> None:
        assert name not in stack, "import cycle: " + " -> ".join([*stack[stack.index(name):], name])
        if name not in done:
            for edge in sorted(graph[name]):
                visit(edge, [*stack, name])
            done.add(name)

    for name in graph:
        visit(name, [])


def test_formats_stand_below_streaming() -> None:
    """A format's module reads records by index and as a stream; the streaming loader reads it
    through that interface (and `stream()` reaches it through the format table), never the
    other way round: no format module, nor the tar module under them, imports readers.streaming."""
    modules = {spec.dataset.partition(":")[0] for spec in FORMATS.values()} | {"readers.tar"}
    importers = [module for module in sorted(modules)
                 if "readers.streaming" in imports_of(ROOT / (module.replace(".", "/") + ".py"), "readers")]
    assert importers == []


def test_inspection_commands_share_one_helper_and_never_import_each_other() -> None:
    """info, show and verify open a dataset through packer.inspect.dataset, not through one another."""
    commands = {"packer.inspect.info", "packer.inspect.show", "packer.inspect.verify"}
    for name in sorted(commands):
        imported = imports_of(ROOT / (name.replace(".", "/") + ".py"), "packer.inspect")
        assert not imported & (commands - {name}), name
        assert "packer.inspect.dataset" in imported, name
