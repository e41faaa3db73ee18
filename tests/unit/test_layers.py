"""The layers the code obeys (docs/architecture.md, "Layers"): a package imports only itself and
packages of the layers below it. master, pserver and trainer share a layer, so none of them
imports another; what two of them need alike lives in jobstate. bench/ and tests/ sit on top.
Every component is imported through the one namespace, `streamtrain.<component>`; a relative
import (`from ..jobstate import x`) is held to the same rules as the absolute one it stands for."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

LAYERS = (
    ("schemas",),
    ("infra",),
    ("jobstate",),
    ("params",),
    ("master", "pserver", "trainer"),
    ("producers",),
    ("streamtrain",),
)
RANK = {package: rank for rank, layer in enumerate(LAYERS) for package in layer}
COMPONENTS = set(RANK) - {"streamtrain"}


def package_of(path: str) -> str:
    """The package a file under ROOT belongs to when installed, which its relative imports
    start from: `schemas/keys.py` is in `streamtrain.schemas`, and so is `schemas/__init__.py`
    (an `__init__` is its package); `streamtrain/cli.py` is in `streamtrain`."""
    parts = list(Path(path).parent.parts)
    return ".".join(parts if parts[:1] == ["streamtrain"] else ["streamtrain", *parts])


def imports(source: str, package: str) -> Iterator[tuple[int, str]]:
    """(line, package) of every import of a project package, at module level or inside a
    function alike: the component of `streamtrain.<component>...`, `streamtrain` for the CLI's
    own modules, and `<component>` itself for an import that bypasses the namespace. A relative
    import is resolved against `package`, the importing module's (`package_of`), as Python
    does; one that climbs above the namespace yields `beyond streamtrain`."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = node.module
            if node.level:
                base = package.split(".")
                if node.level > len(base):
                    yield node.lineno, "beyond streamtrain"
                    continue
                module = ".".join(base[:len(base) - node.level + 1] + ([node.module] if node.module else []))
            if not module:
                continue
            # `from streamtrain import schemas` (or `from .. import schemas` in a component)
            # imports the component, not the CLI's package
            names = [f"{module}.{a.name}" for a in node.names] if module == "streamtrain" else [module]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] == "streamtrain":
                yield node.lineno, parts[1] if len(parts) > 1 and parts[1] in COMPONENTS else "streamtrain"
            elif parts[0] in COMPONENTS:
                yield node.lineno, f"bare {parts[0]}"


def violations(path: str, source: str) -> list[str]:
    """What the file at `path` (relative to ROOT: its first folder is its package) imports
    against the layers."""
    package = Path(path).parts[0]
    found = []
    for line, imported in imports(source, package_of(path)):
        if imported == "beyond streamtrain":
            found.append(f"{path}:{line}: {package} imports relatively from above the streamtrain namespace")
        elif imported.startswith("bare "):
            found.append(f"{path}:{line}: {package} imports {imported[5:]} outside the streamtrain namespace")
        elif imported != package and RANK[imported] >= RANK[package]:
            how = "its sibling" if RANK[imported] == RANK[package] else "a layer above it"
            found.append(f"{path}:{line}: {package} imports {imported}, {how}")
    return found


def test_every_package_imports_only_the_layers_below_it() -> None:
    found = []
    for package in RANK:
        for path in sorted((ROOT / package).rglob("*.py")):
            found += violations(str(path.relative_to(ROOT)), path.read_text())
    assert not found, "\n".join(found)


def test_every_package_has_a_layer() -> None:
    packages = {p.parent.name for p in ROOT.glob("*/__init__.py")} - {"tests", "bench"}
    assert packages == set(RANK), f"place {sorted(packages - set(RANK))} in LAYERS"


def test_an_upward_sideways_or_bare_import_is_caught() -> None:
    assert violations("jobstate/a.py", "from streamtrain.trainer.worker import Trainer\n") == [
        "jobstate/a.py:1: jobstate imports trainer, a layer above it"]
    assert violations("pserver/b.py", "def f():\n    import streamtrain.master.plan\n") == [
        "pserver/b.py:2: pserver imports master, its sibling"]
    assert violations("master/c.py", "from streamtrain.cli import main\n") == [
        "master/c.py:1: master imports streamtrain, a layer above it"]
    assert violations("trainer/d.py", "from jobstate.config import JobConfig\n") == [
        "trainer/d.py:1: trainer imports jobstate outside the streamtrain namespace"]
    assert violations("trainer/e.py", "import streamtrain.schemas\nfrom streamtrain.schemas.config import JobConfig\n"
                                      "from streamtrain.trainer import models\nfrom streamtrain import schemas\n"
                                      "import numpy\n") == []


def test_relative_imports_are_resolved_against_the_importing_package() -> None:
    assert package_of("schemas/keys.py") == package_of("schemas/__init__.py") == "streamtrain.schemas"
    assert package_of("streamtrain/cli.py") == "streamtrain"
    # Within a package, and down to a layer below, as the absolute forms would be.
    assert violations("schemas/f.py",
                      "from . import _json\nfrom ._check import Check\nfrom .keys import Topics\n") == []
    assert violations("trainer/g.py", "from ..jobstate import config\nfrom .. import schemas\n"
                                      "from ..jobstate.etcd import Etcd\nfrom .models import build_model\n") == []
    assert violations("streamtrain/h.py", "from .live import follow\nfrom . import trainer\n") == []
    # Up, sideways, and above the namespace.
    assert violations("jobstate/i.py", "def f():\n    from ..trainer import worker\n") == [
        "jobstate/i.py:2: jobstate imports trainer, a layer above it"]
    assert violations("pserver/j.py", "from .. import master\n") == [
        "pserver/j.py:1: pserver imports master, its sibling"]
    assert violations("schemas/k.py", "from .. import cli\nfrom ..streamtrain import live\n") == [
        "schemas/k.py:1: schemas imports streamtrain, a layer above it",
        "schemas/k.py:2: schemas imports streamtrain, a layer above it"]
    assert violations("schemas/l.py", "from ... import x\n") == [
        "schemas/l.py:1: schemas imports relatively from above the streamtrain namespace"]
