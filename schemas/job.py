"""The job's documents outside the control plane: where it stands, who runs it, and how far
each shard's barrier has got.

| document | where | written by | read by |
|---|---|---|---|
| `JobState` | etcd `state` | the master, after a bounded job's last pass | the master, `status`, `LocalJob` |
| `Holder` | etcd `master/lock`, `trainers/<id>`, `ps/<i>` (each under its lease) | the master, each trainer, each shard | `status`, the master, a successor taking over a dead holder's key |
| `BarrierSteps` | Redis `st:{<job>:<i>}:steps`, and the channel `st:{<job>:<i>}:steps-written` | shard i's publisher (sync and bounded) | trainers waiting after a push |
| `AppliedSteps` | Redis `st:{<job>:<i>}:applied`, in each publish round's transaction with the values | shard i's publisher | trainers, with every pull |
| `ShardStats` | Redis `st:{<job>:<i>}:stats`, every housekeeping pass (about a second) | shard i | the live view and `LocalJob.status`, benches, tests |
| `SlotOwners` | etcd `slots` | the master, once, when the job is first started; `streamtrain resize` | every shard and trainer, `predict`, `job status` (jobstate/sharding.py's `SlotMap`) |
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal

from . import _json
from ._check import U32_MAX, Check

VERSION = 1
_STATES = ("running", "finished")
_ROLES = ("master", "trainer", "pserver")

State = Literal["running", "finished"]
Role = Literal["master", "trainer", "pserver"]


@dataclass(frozen=True)
class JobState:
    """A job is running until its master marks a bounded job finished after the last pass."""

    state: State
    at: float | None = None

    def __post_init__(self) -> None:
        if self.state not in _STATES:
            raise _state.error("state", f"{self.state!r} is not one of {_STATES}")
        if self.at is not None:
            _state.number("at", self.at)

    @property
    def finished(self) -> bool:
        return self.state == "finished"

    def to_json(self) -> bytes:
        return _json.dumps({"v": VERSION, **{k: v for k, v in asdict(self).items() if v is not None}})

    @classmethod
    def from_json(cls, data: bytes | str) -> JobState:
        """Raises: SchemaError."""
        doc = _json.loads(_state, data)
        return cls(_json.field(_state, doc, "state"), doc.get("at"))


@dataclass(frozen=True)
class Holder:
    """The process that holds a key under its lease: the master's lock, a trainer's or a shard's
    membership. `name` is the master's identity, the trainer id or the shard index; `host`,
    `boot` (boot id) and `pidns` (pid namespace), "" where unknown, tell a successor on the
    same machine whether `pid` is gone, so it takes the key without waiting out the lease
    (jobstate/predecessors.py). `address`: where a shard serves, if anywhere."""

    role: Role
    name: str
    pid: int
    host: str
    boot: str = ""
    pidns: str = ""
    since: float = 0.0
    address: str | None = None

    def __post_init__(self) -> None:
        if self.role not in _ROLES:
            raise _holder.error("role", f"{self.role!r} is not one of {_ROLES}")
        _holder.text("name", self.name, max_bytes=255)
        _holder.integer("pid", self.pid, hi=U32_MAX)
        for key in ("host", "boot", "pidns"):
            if not isinstance(getattr(self, key), str):
                raise _holder.error(key, f"expected a string, got {type(getattr(self, key)).__name__}")
        _holder.number("since", self.since)
        if self.address is not None:
            _holder.text("address", self.address)

    def to_json(self) -> bytes:
        return _json.dumps({"v": VERSION, **{k: v for k, v in asdict(self).items() if v is not None}})

    @classmethod
    def from_json(cls, data: bytes | str) -> Holder:
        """Raises: SchemaError."""
        doc = _json.loads(_holder, data)
        role, name, pid, host = _json.required(_holder, doc, "role", "name", "pid", "host")
        return cls(role, name, pid, host, doc.get("boot", ""), doc.get("pidns", ""), doc.get("since", 0.0),
                   doc.get("address"))


@dataclass(frozen=True)
class BarrierSteps:
    """Where shard i's barrier stands once its changes are published: `next`, the step it
    releases next (sync), and `trainers`, each trainer's newest step it has made visible."""

    next: int = 0
    trainers: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _steps.integer("next", self.next)
        if not isinstance(self.trainers, dict):
            raise _steps.error("trainers", "expected an object of trainer id -> step")
        for trainer, step in self.trainers.items():
            # -1: a trainer that joined and has not stepped yet
            _steps.integer(f"trainers.{trainer}", step, lo=-1)

    def to_json(self) -> bytes:
        return _json.dumps({"v": VERSION, "next": self.next, "trainers": self.trainers})

    @classmethod
    def from_json(cls, data: bytes | str) -> BarrierSteps:
        """Raises: SchemaError."""
        doc = _json.loads(_steps, data)
        return cls(_json.field(_steps, doc, "next"),
                   _json.obj(_steps, _json.field(_steps, doc, "trainers"), "trainers"))


@dataclass(frozen=True)
class AppliedSteps:
    """Per trainer, the newest step whose changes shard i's published values include (a
    trainer adds the changes of its own later pushes to what it pulls, trainer/own.py)."""

    steps: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.steps, dict):
            raise _applied.error("steps", "expected an object of trainer id -> step")
        for trainer, step in self.steps.items():
            _applied.integer(f"steps.{trainer}", step)

    def to_json(self) -> bytes:
        return _json.dumps({"v": VERSION, "steps": self.steps})

    @classmethod
    def from_json(cls, data: bytes | str) -> AppliedSteps:
        """Raises: SchemaError."""
        doc = _json.loads(_applied, data)
        return cls(_json.obj(_applied, _json.field(_applied, doc, "steps"), "steps"))


@dataclass(frozen=True)
class BarrierStats:
    """A sync shard's barrier: the step it releases next, deltas held back, and the trainers
    it waits for."""

    next_step: int
    waiting: int
    participants: list[str]


_COUNTS = ("version", "offset", "deltas", "rows", "dropped", "bad", "publishes", "republished", "rows_published",
           "checkpoints", "dedup_entries", "fold_checks", "examples", "damped")


@dataclass(frozen=True)
class ShardStats:
    """What shard `shard` has done since it started serving (counts restored with its
    checkpoint: `examples`, `dropped`, `dedup_entries`; the rest since the process began).

    `offset`: the next gradient offset it reads (everything before is applied); `version`: its
    publish version; `settled`: everything it applied is in Redis, row keys included (what a
    reader of the keys, such as `streamtrain predict`, sees); `checkpoint`: the checkpoint it holds;
    `examples_by_partition`: examples
    applied per input `topic:partition` (each exactly once: the ledger); `table_rows`: rows per
    table; `at`: when it wrote this (epoch s)."""

    shard: int
    pid: int
    serving: bool
    at: float
    version: int = 0
    offset: int = 0
    deltas: int = 0
    rows: int = 0
    dropped: int = 0
    bad: int = 0
    publishes: int = 0
    republished: int = 0
    rows_published: int = 0
    checkpoints: int = 0
    dedup_entries: int = 0
    fold_checks: int = 0
    examples: int = 0
    damped: int = 0
    settled: bool = False
    checkpoint: str | None = None
    barrier: BarrierStats | None = None
    examples_by_partition: dict[str, int] = field(default_factory=dict)
    table_rows: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _stats.integer("shard", self.shard, hi=U32_MAX)
        _stats.integer("pid", self.pid, hi=U32_MAX)
        for key in ("serving", "settled"):
            if not isinstance(getattr(self, key), bool):
                raise _stats.error(key, f"expected a boolean, got {type(getattr(self, key)).__name__}")
        _stats.number("at", self.at)
        for key in _COUNTS:
            _stats.integer(key, getattr(self, key))
        if self.checkpoint is not None:
            _stats.text("checkpoint", self.checkpoint)
        for name in ("examples_by_partition", "table_rows"):
            counts = getattr(self, name)
            if not isinstance(counts, dict):
                raise _stats.error(name, "expected an object of name -> count")
            for key, count in counts.items():
                _stats.integer(f"{name}.{key}", count)

    def to_json(self) -> bytes:
        return _json.dumps({"v": VERSION, **asdict(self)})

    @classmethod
    def from_json(cls, data: bytes | str) -> ShardStats:
        """Raises: SchemaError."""
        doc = _json.loads(_stats, data)
        known = {f.name for f in fields(cls)}
        values: dict[str, Any] = {k: v for k, v in doc.items() if k in known}
        for key in ("shard", "pid", "serving", "at"):
            _json.field(_stats, doc, key)
        barrier = values.get("barrier")
        if barrier is not None:
            barrier = _json.obj(_stats, barrier, "barrier")
            values["barrier"] = BarrierStats(_stats.integer("barrier.next_step", barrier.get("next_step")),
                                             _stats.integer("barrier.waiting", barrier.get("waiting")),
                                             list(_json.array(_stats, barrier.get("participants"),
                                                              "barrier.participants")))
        return cls(**values)


@dataclass(frozen=True)
class SlotOwners:
    """The slot map's document: the shard that owns each slot (jobstate/sharding.py hashes
    rows and dense blocks into slots) and the map's epoch (0 as the master first writes it,
    one more at every `streamtrain resize`; a map written before epochs reads as 0)."""

    owners: tuple[int, ...]
    epoch: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.owners, (tuple, list)) or not self.owners:
            raise _slots.error("owners", "expected a non-empty list of shard indexes")
        for i, owner in enumerate(self.owners):
            _slots.integer(f"owners[{i}]", owner, hi=U32_MAX)
        _slots.integer("epoch", self.epoch)

    def to_json(self) -> bytes:
        return _json.dumps({"v": VERSION, "owners": list(self.owners), "epoch": self.epoch})

    @classmethod
    def from_json(cls, data: bytes | str) -> SlotOwners:
        """Raises: SchemaError."""
        doc = _json.loads(_slots, data)
        return cls(tuple(_json.array(_slots, _json.field(_slots, doc, "owners"), "owners")),
                   _json.field(_slots, doc, "epoch", 0))


_state = Check("JobState", VERSION)
_holder = Check("Holder", VERSION)
_steps = Check("BarrierSteps", VERSION)
_stats = Check("ShardStats", VERSION)
_applied = Check("AppliedSteps", VERSION)
_slots = Check("SlotOwners", VERSION)
