"""The layers the code obeys (docs/architecture.md, "Layers"): a package imports only itself and
packages of the layers below it. master, pserver and trainer share a layer, so none of them
imports another; what two of them need alike lives in jobstate. bench/ and tests/ sit on top."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

LAYERS = (
    ("schemas",),
    ("infra",),
    ("jobstate",),
    ("master", "pserver", "trainer"),
    ("producers",),
    ("streamtrain",),
)
RANK = {package: rank for rank, layer in enumerate(LAYERS) for package in layer}


def imports(source: str) -> Iterator[tuple[int, str]]:
    """(line, top-level package) of every absolute import of a project package, at module
    level or inside a function alike."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        for name in names:
            top = name.partition(".")[0]
            if top in RANK:
                yield node.lineno, top


def violations(package: str, source: str, where: str) -> list[str]:
    found = []
    for line, imported in imports(source):
        if imported != package and RANK[imported] >= RANK[package]:
            how = "its sibling" if RANK[imported] == RANK[package] else "a layer above it"
            found.append(f"{where}:{line}: {package} imports {imported}, {how}")
    return found


def test_every_package_imports_only_the_layers_below_it() -> None:
    found = []
    for package in RANK:
        for path in sorted((ROOT / package).rglob("*.py")):
            found += violations(package, path.read_text(), str(path.relative_to(ROOT)))
    assert not found, "\n".join(found)


def test_every_package_has_a_layer() -> None:
    packages = {p.parent.name for p in ROOT.glob("*/__init__.py")} - {"tests", "bench"}
    assert packages == set(RANK), f"place {sorted(packages - set(RANK))} in LAYERS"


def test_an_upward_or_sideways_import_is_caught() -> None:
    assert violations("jobstate", "from trainer.worker import Trainer\n", "a.py") == [
        "a.py:1: jobstate imports trainer, a layer above it"]
    assert violations("pserver", "def f():\n    import master.plan\n", "b.py") == [
        "b.py:2: pserver imports master, its sibling"]
    assert violations("trainer", "import schemas\nfrom jobstate.config import JobConfig\nimport numpy\n", "c.py") == []
