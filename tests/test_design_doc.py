"""docs/design.md is the map of both packages: every module is named in the paragraph of its own
folder, so a newcomer finds each one there, and packer/'s top level stays a short list of rooms,
each saying what it is for."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DESIGN = ROOT / "docs" / "design.md"
SECTION = re.compile(r"^#{2,3} (.*)$", re.MULTILINE)
FOLDER = re.compile(r"^`((?:packer|readers)/(?:[a-z_]+/)*)`$")
MAX_TOP_LEVEL = 12


def folder_sections() -> dict[str, str]:
    """design.md's text under each heading that names a folder (`packer/plan/`), up to the next heading."""
    text = DESIGN.read_text(encoding="utf-8")
    headings = list(SECTION.finditer(text))
    sections = {}
    for heading, following in zip(headings, [*headings[1:], None]):
        if (folder := FOLDER.match(heading.group(1).strip())) is not None:
            sections[folder.group(1)] = text[heading.end():following.start() if following else len(text)]
    return sections


def package_folders() -> list[Path]:
    return sorted(path.parent for package in ("packer", "readers") for path in (ROOT / package).glob("**/__init__.py"))


def test_every_module_is_named_in_its_folders_paragraph() -> None:
    sections = folder_sections()
    unnamed = []
    for folder in package_folders():
        key = folder.relative_to(ROOT).as_posix() + "/"
        assert key in sections, f"docs/design.md has no heading `{key}`"
        unnamed += [f"{key}{path.name}" for path in sorted(folder.glob("*.py"))
                    if path.name != "__init__.py" and f"`{path.stem}`" not in sections[key]]
    assert unnamed == []


def test_packer_top_level_is_a_few_rooms_each_with_its_docstring() -> None:
    entries = [path for path in (ROOT / "packer").iterdir() if path.name not in ("__pycache__", "py.typed")]
    assert len(entries) <= MAX_TOP_LEVEL, sorted(path.name for path in entries)
    for folder in package_folders():
        docstring = ast.get_docstring(ast.parse((folder / "__init__.py").read_text(encoding="utf-8")))
        assert docstring and len(docstring.split()) >= 20, f"{folder.relative_to(ROOT)}: no paragraph says what it is for"
