"""Issue #14: a class whose methods keep adding attributes is doing everything. `Trainer` and
`PserverShard` declare every attribute they have in `__init__`; what they build once the job's
config is known is one parts object (trainer/assembly.py `TrainerParts`, pserver/shard.py
`ShardParts`), and the few attributes that change after `__init__` are named below, so a new
one is a decision, not a drift. Read by AST, without importing torch or the clients."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# (file, class) -> the attributes its methods other than __init__ assign: each declared there.
CHANGING = {
    # parts: made once the config is known, their sharded half again at a resize; slots_seen:
    # the slot map's newest revision, which the feed reads as it claims.
    ("trainer/worker.py", "Trainer"): {"parts", "lease", "step", "slots_seen"},
    ("pserver/shard.py", "PserverShard"): {"index", "lease", "parts", "state", "barrier", "schedule", "serving",
                                           "_fold", "fold_checks"},
}


def assigned(method: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    """The names `X` of every `self.X` the method assigns: plainly, in a tuple or chain, augmented,
    annotated, as a loop or `with` target, or by `setattr(self, ...)` (as `setattr(...)`)."""
    if not method.args.args or any(isinstance(d, ast.Name) and d.id == "staticmethod"
                                   for d in method.decorator_list):
        return set()
    me = method.args.args[0].arg
    names: set[str] = set()
    for node in ast.walk(method):
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign, ast.For, ast.AsyncFor)):
            targets = [node.target]
        elif isinstance(node, ast.withitem) and node.optional_vars is not None:
            targets = [node.optional_vars]
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr"
              and node.args and isinstance(node.args[0], ast.Name) and node.args[0].id == me):
            names.add("setattr(...)")
            continue
        else:
            continue
        for target in targets:
            for sub in ast.walk(target):
                if (isinstance(sub, ast.Attribute) and isinstance(sub.ctx, ast.Store)
                        and isinstance(sub.value, ast.Name) and sub.value.id == me):
                    names.add(sub.attr)
    return names


def by_method(source: str, class_name: str) -> dict[str, set[str]]:
    """Per method of the class, the attributes of its instance it assigns."""
    [cls] = [n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == class_name]
    return {f.name: assigned(f) for f in cls.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))}


@pytest.mark.parametrize("path, class_name", sorted(CHANGING))
def test_every_attribute_is_declared_in_init_and_only_the_named_ones_change_later(path, class_name) -> None:
    methods = by_method((ROOT / path).read_text(), class_name)
    declared = methods.pop("__init__")
    later = {f"{name}: self.{attr}" for name, attrs in methods.items() for attr in attrs - declared}
    assert not later, f"{class_name} adds attributes outside __init__ (declare them there): {sorted(later)}"
    changing = set().union(*methods.values())
    assert changing == CHANGING[(path, class_name)], (
        f"{class_name}'s attributes changed after __init__ are now {sorted(changing)}: a new one belongs in its "
        "parts object if it is fixed once built, else in CHANGING with a reason")


def test_the_walk_sees_every_way_of_assigning_an_attribute() -> None:
    source = '''
class C:
    def __init__(this):
        this.a = 0
    def m(this, other):
        this.b, (this.c, *this.d) = 1, (2, 3)
        this.a += 1
        this.e: int = 0
        this.f = this.g.h = other.i = 5
        for this.j in ():
            pass
        with open("x") as this.k:
            pass
        setattr(this, "l", 1)
        this.m[0] = 1
        this.n.o = 2
    @staticmethod
    def s(self):
        self.p = 1
'''
    methods = by_method(source, "C")
    assert methods["__init__"] == {"a"} and methods["s"] == set()
    assert methods["m"] == {"a", "b", "c", "d", "e", "f", "j", "k", "setattr(...)"}
