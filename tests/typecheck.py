"""mypy over the packages, each module under the name it is imported by: `streamtrain.jobstate.queue`
for jobstate/queue.py. `make lint` and `make test` run it; options come from pyproject's [tool.mypy].

    python tests/typecheck.py               # every package (pyproject's package-dir)
    python tests/typecheck.py jobstate      # some folders, still under their installed names

Why not plain `mypy`: the components keep top-level folders and install as subpackages of
`streamtrain` through setuptools' package-dir (pyproject.toml). mypy names a module by its
folders, so given jobstate/ it checks a package `jobstate`, and cannot follow the import hook of
the editable install either (`mypy -p streamtrain.jobstate` finds nothing). Every
`from streamtrain.jobstate import ...` would then be a missing module, silently Any. So this
collects the files as mypy does, renames each module by package-dir, and runs mypy's own build
on them: imports between the packages resolve to the files being checked, and errors name the
real paths.
"""

from __future__ import annotations

import os
import sys
import time
import tomllib
from pathlib import Path

from mypy import util
from mypy.fscache import FileSystemCache
from mypy.main import process_options, run_build
from mypy.modulefinder import BuildSource

ROOT = Path(__file__).resolve().parents[1]


def installed_names() -> dict[str, str]:
    """folder -> the package it installs as, from pyproject's [tool.setuptools.package-dir]."""
    with open(ROOT / "pyproject.toml", "rb") as f:
        package_dir = tomllib.load(f)["tool"]["setuptools"]["package-dir"]
    return {folder: package for package, folder in package_dir.items()}


def renamed(source: BuildSource, names: dict[str, str]) -> BuildSource:
    """`source` under its installed name: mypy calls jobstate/queue.py `jobstate.queue` (its
    folders up to the first without an __init__.py), which installs as `streamtrain.jobstate.queue`."""
    top, dot, rest = source.module.partition(".")
    if top not in names:
        raise SystemExit(f"{source.path}: not in a package of pyproject's package-dir")
    return BuildSource(source.path, names[top] + dot + rest, source.text, source.base_dir, source.followed)


def main(argv: list[str]) -> int:
    os.chdir(ROOT)  # pyproject's [tool.mypy] and the folder names are the repository's
    t0 = time.time()
    names = installed_names()
    fscache = FileSystemCache()
    sources, options = process_options(argv or sorted(names), sys.stdout, sys.stderr, fscache=fscache)
    sources = [renamed(source, names) for source in sources]
    _, messages, blockers = run_build(sources, options, fscache, t0, sys.stdout, sys.stderr)
    n_errors, n_notes, n_files = util.count_stats(messages)
    formatter = util.FancyFormatter(sys.stdout, sys.stderr, options.hide_error_codes)
    if n_errors:
        print(formatter.format_error(n_errors, n_files, len(sources), blockers=blockers,
                                     use_color=options.color_output))
    else:
        print(formatter.format_success(len(sources), options.color_output))
    return (2 if blockers else 1) if n_errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
