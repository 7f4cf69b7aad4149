"""The architecture page's module map names every module of ``anarchon_core``, and
only modules that exist: it cannot drift from the tree unnoticed."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "anarchon_core"


def mapped() -> set[str]:
    """The paths (relative to the package) that the map's code block names."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    block = text.split("```\nanarchon_core/\n", 1)[1].split("```", 1)[0]
    names: set[str] = set()
    folder = ""
    for line in block.splitlines():
        indent = len(line) - len(line.lstrip())
        entry = re.split(r"\s{2,}", line.strip(), maxsplit=1)[0]
        if indent == 2:
            folder = ""
        if entry.endswith("/"):
            names.add(folder + entry.rstrip("/"))  # a folder within a folder: web/dashboard
            folder = entry if indent == 2 else folder
            continue
        for name in (n.strip() for n in entry.split(",")):
            names.add(folder + name)
    return names


def test_the_module_map_names_every_module_and_no_other() -> None:
    modules = {str(path.relative_to(PACKAGE)) for path in PACKAGE.rglob("*.py")}
    folders = {"backends", "cli", "engine", "web", "web/dashboard"}
    listed = mapped()
    assert modules - listed == set(), "modules missing from docs/architecture.md"
    assert listed - modules - folders == set(), "the map names modules that do not exist"
    assert all((PACKAGE / folder).is_dir() for folder in folders & listed)
