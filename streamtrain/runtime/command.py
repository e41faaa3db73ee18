"""What a supervisor's children run: a `Command`, given to the `Supervisor` by its user."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Command:
    """A command line `NAME ARGS`, started in one of two ways.

    - As a new interpreter: `argv + ARGS` (e.g. `python -m streamtrain ARGS`).
    - Warm (warm.py): forked from a server that has imported `preload`, the child calls the
      function `entry` names ("module:function") with `sys.argv` set to `[name, *ARGS]`.

    Both must run the same program: the supervisor falls back from the second to the first.
    `name` also names the child in its log and its process title."""

    name: str
    argv: tuple[str, ...]
    entry: str
    preload: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        module, sep, function = self.entry.partition(":")
        if not (module and sep and function):
            raise ValueError(f"Command {self.name!r}: entry must be 'module:function', got {self.entry!r}")
        if not self.argv:
            raise ValueError(f"Command {self.name!r}: argv is empty")
