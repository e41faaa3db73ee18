"""One root exception: every public exception class streamtrain defines derives from
`schemas.StreamtrainError`, so a caller can catch all of them at once."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from pathlib import Path

from streamtrain.schemas import StreamtrainError

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("schemas", "infra", "jobstate", "master", "pserver", "trainer", "producers", "streamtrain")


def test_every_public_exception_derives_from_the_root() -> None:
    strays = []
    for package in PACKAGES:
        prefix = "streamtrain." if package == "streamtrain" else f"streamtrain.{package}."
        for info in pkgutil.walk_packages([str(ROOT / package)], prefix=prefix):
            if info.name.endswith("__main__"):
                continue
            module = importlib.import_module(info.name)
            for name, obj in vars(module).items():
                if (inspect.isclass(obj) and issubclass(obj, BaseException) and obj.__module__ == info.name
                        and not name.startswith("_") and not issubclass(obj, StreamtrainError)):
                    strays.append(f"{info.name}.{name}")
    assert not strays, f"derive from StreamtrainError: {strays}"
