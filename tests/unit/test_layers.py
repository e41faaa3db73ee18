"""The layers the code obeys (docs/architecture.md, "Layers"): a package imports only itself and
packages of the layers below it. master, pserver and trainer share a layer, so none of them
imports another; what two of them need alike lives in jobstate. bench/ and tests/ sit on top.
Every component is imported through the one namespace, `streamtrain.<component>`."""

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
COMPONENTS = set(RANK) - {"streamtrain"}


def imports(source: str) -> Iterator[tuple[int, str]]:
    """(line, package) of every absolute import of a project package, at module level or inside
    a function alike: the component of `streamtrain.<component>...`, `streamtrain` for the CLI's
    own modules, and `<component>` itself for an import that bypasses the namespace."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            # `from streamtrain import schemas` imports the component, not the CLI's package
            names = [f"{node.module}.{a.name}" for a in node.names] if node.module == "streamtrain" else [node.module]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] == "streamtrain":
                yield node.lineno, parts[1] if len(parts) > 1 and parts[1] in COMPONENTS else "streamtrain"
            elif parts[0] in COMPONENTS:
                yield node.lineno, f"bare {parts[0]}"


def violations(package: str, source: str, where: str) -> list[str]:
    found = []
    for line, imported in imports(source):
        if imported.startswith("bare "):
            found.append(f"{where}:{line}: {package} imports {imported[5:]} outside the streamtrain namespace")
        elif imported != package and RANK[imported] >= RANK[package]:
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


def test_an_upward_sideways_or_bare_import_is_caught() -> None:
    assert violations("jobstate", "from streamtrain.trainer.worker import Trainer\n", "a.py") == [
        "a.py:1: jobstate imports trainer, a layer above it"]
    assert violations("pserver", "def f():\n    import streamtrain.master.plan\n", "b.py") == [
        "b.py:2: pserver imports master, its sibling"]
    assert violations("master", "from streamtrain.cli import main\n", "c.py") == [
        "c.py:1: master imports streamtrain, a layer above it"]
    assert violations("trainer", "from jobstate.config import JobConfig\n", "d.py") == [
        "d.py:1: trainer imports jobstate outside the streamtrain namespace"]
    assert violations("trainer", "import streamtrain.schemas\nfrom streamtrain.jobstate.config import JobConfig\n"
                                 "from streamtrain.trainer import models\nfrom streamtrain import schemas\nimport numpy\n",
                      "e.py") == []
