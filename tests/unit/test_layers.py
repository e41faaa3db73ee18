"""The layers the code obeys (docs/architecture.md, "Layers"): a package imports only itself and
packages of the layers below it. master, pserver and trainer share a layer, so none of them
imports another; what two of them need alike lives in jobstate. bench/ and tests/ sit on top.
Every component is imported through the one namespace, `streamtrain.<component>`; a relative
import (`from ..jobstate import x`) is held to the same rules as the absolute one it stands for.

The top package, `streamtrain/`, is ranked the same way in parts (`PARTS`, one to a rank): a
module imports only its own part and the parts before it, so no import cycle runs through two
parts, and `test_the_top_package_has_no_import_cycle` finds none inside one. The runtime imports
nothing of streamtrain but itself; only `__main__` imports the CLI, the last part."""

from __future__ import annotations

import ast
import tomllib
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

# The parts of the top package, in order: a module's part is its first name under streamtrain/
# (a module's stem or a subpackage's folder).
PARTS = (
    "runtime",  # the supervisor and its fork server, for any command: nothing else of streamtrain
    "operations",  # checkpoint, rollback, resize, predict, curves as library functions
    "monitor",  # a running job's status as a plain type
    "local",  # LocalJob
    "__init__",  # the package's lazy Python API (what `from streamtrain import X` names)
    "console",  # the live view, `job run`, the demo
    "cli",  # the command line
    "__main__",  # `python -m streamtrain` and the console script: the CLI's only importer
)
PART_RANK = {part: rank for rank, part in enumerate(PARTS)}
STANDALONE = {"runtime"}  # parts that import no component either
TOP = ROOT / "streamtrain"
TOP_NAMES = {p.stem for p in TOP.glob("*.py")} | {p.parent.name for p in TOP.glob("*/__init__.py")}


def part_of(path: str) -> str:
    """The part of the top package the file at `path` (relative to ROOT, under streamtrain/) is
    in: `streamtrain/console/live.py` is in `console`, `streamtrain/local.py` in `local`,
    `streamtrain/__init__.py` in `__init__`."""
    parts = Path(path).parts
    return parts[1] if len(parts) > 2 else Path(parts[1]).stem


def package_of(path: str) -> str:
    """The package a file under ROOT belongs to when installed, which its relative imports
    start from: `schemas/keys.py` is in `streamtrain.schemas`, and so is `schemas/__init__.py`
    (an `__init__` is its package); `streamtrain/cli.py` is in `streamtrain`."""
    parts = list(Path(path).parent.parts)
    return ".".join(parts if parts[:1] == ["streamtrain"] else ["streamtrain", *parts])


def imported_modules(source: str, package: str) -> Iterator[tuple[int, str | None, list[str] | None]]:
    """(line, module, names) of every import statement, at module level or inside a function
    alike: `import a.b` gives ("a.b", None), `from a import b, c` gives ("a", ["b", "c"]). A
    relative import is resolved against `package`, the importing module's (`package_of`), as
    Python does; one that climbs above the namespace gives a module of None."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name, None
        elif isinstance(node, ast.ImportFrom):
            module = node.module
            if node.level:
                base = package.split(".")
                if node.level > len(base):
                    yield node.lineno, None, None
                    continue
                module = ".".join(base[:len(base) - node.level + 1] + ([node.module] if node.module else []))
            if module:
                yield node.lineno, module, [alias.name for alias in node.names]


def imports(source: str, package: str) -> Iterator[tuple[int, str, str | None]]:
    """(line, package, part) of every import of a project package: the component of
    `streamtrain.<component>...`, `streamtrain` for the top package's own modules (with the part
    it names: `streamtrain.console.live` is in `console`, a name `from streamtrain import` takes
    that is no module is `__init__`'s), and `bare <component>` for an import that bypasses the
    namespace; `beyond streamtrain` for a relative one that climbs above it (`imported_modules`)."""
    for line, module, aliases in imported_modules(source, package):
        if module is None:
            yield line, "beyond streamtrain", None
            continue
        # `from streamtrain import schemas` (or `from .. import schemas` in a component)
        # imports the component, not the top package; `from streamtrain import LocalJob` a name
        # of the package's `__init__`
        names = [module]
        if module == "streamtrain" and aliases:
            names = [f"{module}.{a}" if a in COMPONENTS or a in TOP_NAMES or a in PART_RANK else module
                     for a in aliases]
        for name in names:
            parts = name.split(".")
            if parts[0] == "streamtrain":
                if len(parts) > 1 and parts[1] in COMPONENTS:
                    yield line, parts[1], None
                else:
                    yield line, "streamtrain", parts[1] if len(parts) > 1 else "__init__"
            elif parts[0] in COMPONENTS:
                yield line, f"bare {parts[0]}", None


def violations(path: str, source: str) -> list[str]:
    """What the file at `path` (relative to ROOT: its first folder is its package) imports
    against the layers, and, in the top package, against the order of its parts."""
    package = Path(path).parts[0]
    part = part_of(path) if package == "streamtrain" else None
    found = []
    if part is not None and part not in PART_RANK:
        found.append(f"{path}: {part} is in no part of the top package: rank it in PARTS")
    for line, imported, its_part in imports(source, package_of(path)):
        if imported == "beyond streamtrain":
            found.append(f"{path}:{line}: {package} imports relatively from above the streamtrain namespace")
        elif imported.startswith("bare "):
            found.append(f"{path}:{line}: {package} imports {imported[5:]} outside the streamtrain namespace")
        elif imported != package and RANK[imported] >= RANK[package]:
            how = "its sibling" if RANK[imported] == RANK[package] else "a layer above it"
            found.append(f"{path}:{line}: {package} imports {imported}, {how}")
        elif part in STANDALONE and imported != "streamtrain":
            found.append(f"{path}:{line}: {part} imports {imported}: it imports nothing of streamtrain but itself")
        elif part in PART_RANK and imported == "streamtrain" and its_part != part:
            if its_part not in PART_RANK:
                found.append(f"{path}:{line}: {part} imports {its_part}, in no part of the top package")
            elif PART_RANK[its_part] > PART_RANK[part]:
                found.append(f"{path}:{line}: {part} imports {its_part}, a part after it")
    return found


def module_of(path: Path) -> str:
    """The dotted name of a module of the top package: `streamtrain.console.live` for
    streamtrain/console/live.py, `streamtrain.console` for its `__init__.py`."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_cycle(graph: dict[str, set[str]]) -> list[str]:
    """A cycle of `graph` (module -> the modules it imports) as the modules along it, first
    repeated at the end; [] if it has none."""
    state: dict[str, str] = {}  # "open" while on the path, "done" once every way out is known

    def visit(node: str, path: list[str]) -> list[str]:
        state[node] = "open"
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                return [*path[path.index(nxt):], node, nxt] if nxt in path else [node, nxt]
            if nxt not in state and (cycle := visit(nxt, [*path, node])):
                return cycle
        state[node] = "done"
        return []

    for start in sorted(graph):
        if start not in state and (cycle := visit(start, [])):
            return cycle
    return []


def test_every_package_imports_only_the_layers_below_it() -> None:
    found = []
    for package in RANK:
        for path in sorted((ROOT / package).rglob("*.py")):
            found += violations(str(path.relative_to(ROOT)), path.read_text())
    assert not found, "\n".join(found)


def test_every_package_has_a_layer() -> None:
    packages = {p.parent.name for p in ROOT.glob("*/__init__.py")} - {"tests", "bench"}
    assert packages == set(RANK), f"place {sorted(packages - set(RANK))} in LAYERS"


def test_every_package_is_installed() -> None:
    # setuptools installs only the packages pyproject.toml lists: a subpackage left out works
    # in the editable install the tests use and is missing from a wheel or the image.
    setup = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    folders = {Path(folder): name for name, folder in setup["package-dir"].items()}
    found = set()
    for package in RANK:
        for init in (ROOT / package).rglob("__init__.py"):
            relative = init.parent.relative_to(ROOT)
            top = Path(relative.parts[0])
            found.add(".".join([folders[top], *relative.parts[1:]]))
    assert found == set(setup["packages"]), f"pyproject.toml packages: add {sorted(found - set(setup['packages']))}"


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
    assert violations("streamtrain/console/h.py", "from .live import follow\nfrom .. import trainer\n"
                                                  "from ..local import LocalJob\nfrom . import demo\n") == []
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


def test_every_module_of_the_top_package_imports_only_the_parts_before_its_own() -> None:
    unranked = sorted(TOP_NAMES - set(PARTS))
    assert not unranked, f"rank {unranked} in PARTS"
    assert set(STANDALONE) <= set(PARTS)
    found = []
    for path in sorted(TOP.rglob("*.py")):
        found += violations(str(path.relative_to(ROOT)), path.read_text())
    assert not found, "\n".join(found)


def test_the_top_package_has_no_import_cycle() -> None:
    modules = {module_of(path): path for path in TOP.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        package = package_of(str(path.relative_to(ROOT)))
        targets = set()
        for _, module, aliases in imported_modules(path.read_text(), package):
            if module is not None:
                targets |= {m for m in (module, *(f"{module}.{a}" for a in aliases or ())) if m in modules}
        graph[name] = targets - {name}
    assert graph["streamtrain.__main__"] == {"streamtrain.cli"}
    assert not import_cycle(graph), " -> ".join(import_cycle(graph))
    assert [m for m, imported in graph.items() if "streamtrain.cli" in imported] == ["streamtrain.__main__"]


def test_an_upward_import_inside_the_top_package_is_caught() -> None:
    assert part_of("streamtrain/runtime/warm.py") == "runtime" and part_of("streamtrain/local.py") == "local"
    assert part_of("streamtrain/__init__.py") == "__init__"
    # Up, in a function too, absolute or relative, or through the package's own names.
    assert violations("streamtrain/runtime/a.py", "def f():\n    from streamtrain.local import LocalJob\n") == [
        "streamtrain/runtime/a.py:2: runtime imports local, a part after it"]
    assert violations("streamtrain/monitor.py", "from .console import live\n") == [
        "streamtrain/monitor.py:1: monitor imports console, a part after it"]
    assert violations("streamtrain/local.py", "from streamtrain import Snapshot\nfrom streamtrain import cli\n") == [
        "streamtrain/local.py:1: local imports __init__, a part after it",
        "streamtrain/local.py:2: local imports cli, a part after it"]
    assert violations("streamtrain/console/b.py", "def f():\n    from ..cli import app\n") == [
        "streamtrain/console/b.py:2: console imports cli, a part after it"]
    # The runtime imports no component either; a module in no part is named.
    assert violations("streamtrain/runtime/c.py",
                      "from streamtrain.infra import Endpoints\nfrom .warm import start\n") == [
        "streamtrain/runtime/c.py:1: runtime imports infra: it imports nothing of streamtrain but itself"]
    assert violations("streamtrain/extra.py", "import os\n") == [
        "streamtrain/extra.py: extra is in no part of the top package: rank it in PARTS"]
    assert violations("streamtrain/operations/d.py", "from streamtrain.nowhere import x\n") == [
        "streamtrain/operations/d.py:1: operations imports nowhere, in no part of the top package"]
    # Down, within a part and to a component: allowed.
    assert violations("streamtrain/console/e.py", "from streamtrain import LocalJob\nfrom ..monitor import Snapshot\n"
                                                  "from streamtrain.runtime.supervisor import Supervisor\n"
                                                  "from .demo import run_demo\n"
                                                  "from streamtrain.infra import Endpoints\n") == []
    assert violations("streamtrain/__main__.py", "from streamtrain.cli import main\n") == []


def test_a_cycle_inside_a_part_is_found() -> None:
    assert import_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) == []
    assert import_cycle({"a": {"b"}, "b": {"c"}, "c": {"b"}}) == ["b", "c", "b"]
    assert import_cycle({"x": {"x"}}) == ["x", "x"]


def test_the_packages_lazy_names_come_from_parts_before_it() -> None:
    # `streamtrain/__init__.py` imports by name on first use (importlib): held to its rank as an
    # import statement would be.
    import streamtrain

    for name, module in streamtrain._EXPORTS.items():
        parts = module.split(".")
        assert parts[0] == "streamtrain" and len(parts) > 1, (name, module)
        assert parts[1] in COMPONENTS or PART_RANK[parts[1]] < PART_RANK["__init__"], (name, module)
        assert hasattr(streamtrain, name), name


def test_the_package_exports_its_lazy_names_and_its_version() -> None:
    import streamtrain

    assert streamtrain.__all__ == sorted([*streamtrain._EXPORTS, "__version__"])
    assert isinstance(streamtrain.__version__, str) and streamtrain.__version__
