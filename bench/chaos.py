"""A job under chaos: processes killed and frozen, services killed and restarted, on a seeded
schedule; then the ledger is checked and recovery is timed.

    python -m bench.chaos [--profile ci|full] [--records N] [--passes N] [--every-s S]
                          [--faults trainer loader shard master freeze kafka etcd redis]
                          [--clusters] [--vocab-scale K] [--seed N] [--out report.json]

The workload is `bench.e2e`'s (production-like CTR records as CSV on a 2-partition topic,
WideDeep, Adam); the job's `[train]` and `[tasks]` keep their defaults. Its master, 2 shards and
2 trainers run as `streamtrain` processes under the supervisor `streamtrain job run` uses
(streamtrain/runtime/supervisor.py), which restarts what dies. First a fault-free run of the job gives
the reference rate and holdout AUC; then the same job runs again while every `--every-s` a
fault from `--faults`, in a seeded shuffled order, hits it:

- `trainer`, `shard`, `master`: SIGKILL of that process (the supervisor restarts it);
- `loader`: SIGKILL of a trainer's loader child (its trainer restarts it);
- `freeze`: SIGSTOP of a trainer, shard or master for longer than its lease, then SIGCONT;
- `kafka`, `etcd`, `redis`: SIGKILL of the service, restarted 2 s later (Redis empty). With
  `--clusters` the services are `streamtrain up --kafka-brokers 3 --etcd-members 3
  --redis-cluster 3`'s and the fault hits one node: a broker at random, the etcd leader, the
  Redis master holding a random shard's keys (restarted before its node timeout, so it may
  come back an empty master, as a master without persistence restarted at once does).

Recovery per fault: **back** is kill -> the process working again (a trainer's or loader's
pushes published again, a shard publishing again, a master holding the lock again, a service
answering again, and Redis holding every shard's parameters again; a freeze counts from its
SIGCONT), **rate** is kill -> the job's applied rate
over a 2 s window wholly after the kill back above half the fault-free rate (so never under
2 s). Reported p50/p99 per kind. The next fault waits until the last one's target is back
(up to `RECOVERING_S`): each back is one fault's, not the sum of several landing together.

Checked at the end, by ledger: the job finished its passes; each shard applied exactly the
records of each partition once per pass (none lost, none twice: the shards' dedup ledger drops
every redone group, reported as `dropped`); holdout AUC no more than `AUC_TOLERANCE` below the
fault-free run's.
Exits 1 if a check fails.

One module on purpose: a bench is read top to bottom as the record of what it measures (its
decisions, the schedule, recovery and ledger, are pure functions with unit tests).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from bench.e2e import MODELS, Workload, children, examples, job_toml, quality, start_time, steady_rate, write_log
from streamtrain.infra import Endpoints, LocalServices, Ports
from streamtrain.infra.clients import redis_client
from streamtrain.infra.cpus import available
from streamtrain.infra.etcd_server import is_leader
from streamtrain.jobstate.errors import EtcdError
from streamtrain.jobstate.etcd import Etcd
from streamtrain.jobstate.sharding import SlotMap
from streamtrain.local import COMMAND, trainer_args
from streamtrain.params.redisnodes import ShardNodes
from streamtrain.runtime.supervisor import Supervisor, pid_alive
from streamtrain.schemas import AppliedSteps, EtcdKeys, JobState, RedisKeys, ShardStats, partition_label
from streamtrain.schemas.config import JobConfig
from streamtrain.trainer.scoring import Scorer

PROCESS_FAULTS = ("trainer", "loader", "shard", "master", "freeze")
SERVICE_FAULTS = ("kafka", "etcd", "redis")
SHARDS, TRAINERS = 2, 2
BIG_SHARD_ROWS = 1_000_000  # a shard holding this many rows is timed apart too (issue: <= 10 s back)
# Below the fault-free run's AUC. The gap between a run with faults and one without moves by
# about 0.006 (one standard deviation) from pair to pair: the CI profile's gaps were -0.0065 to
# +0.0053 and once below -0.01 (bench/RESULTS.md), and two fault-free runs alone differ by about
# 0.004. A bound of 0.01 failed about one correct run in ten; 0.02 is over three deviations.
AUC_TOLERANCE = 0.02
WINDOW_S = 2.0  # the applied rate is measured over this trailing window
SAMPLE_S = 0.2
SERVICE_DOWN_S = 2.0
FREEZE_PAST_LEASE_S = 3.0
LEASE_S = 10  # the trainers' and shards' membership leases (their CLI defaults)
RECOVERING_S = 60.0  # a fault whose target is not back this long after it holds the schedule no longer


@dataclass(frozen=True)
class Profile:
    records: int
    passes: int  # enough for the job to outlast the schedule under it
    every_s: float
    rounds: int  # each kind comes up this many times
    faults: tuple[str, ...] = PROCESS_FAULTS + SERVICE_FAULTS


PROFILES = {
    # Every kind once, in under 5 minutes here.
    "ci": Profile(2_500_000, 1, 2.0, 1),
    # Every kind 100 times, a fault every 2 s; the schedule holds until each fault's target is
    # back (a freeze 13 s and more, Kafka ~8 s with the 2 s wait): about an hour of faults
    # (the CI profile's 8 took 34 s). While they come the job keeps 35-70% of its fault-free
    # 25-34k examples/s here (bench/RESULTS.md), so one pass over 70M records outlasts them up
    # to 20k/s; the fault-free run takes 35-45 minutes. Two passes over 60M would have run the job
    # an hour past the schedule here, and the profile over three hours. (300 passes over 500k records
    # trained to an AUC of 0.635: a model overfit to its log says little of what faults cost.)
    "full": Profile(70_000_000, 1, 2.0, 100),
}


def schedule(kinds: tuple[str, ...], count: int, seed: int) -> list[str]:
    """`count` faults: rounds of every kind in a shuffled order, so each kind comes up evenly."""
    rng, out = random.Random(seed), []
    while len(out) < count:
        kinds_round = list(kinds)
        rng.shuffle(kinds_round)
        out += kinds_round
    return out[:count]


def first_at_or_above(times: np.ndarray, rates: np.ndarray, after: float, threshold: float,
                      window_s: float = WINDOW_S) -> float | None:
    """The end of the first trailing window wholly after `after` whose rate is at least
    `threshold` (a rate back within the window reads as the window's length)."""
    hit = np.nonzero((times - window_s >= after) & (rates >= threshold))[0]
    return float(times[hit[0]]) if len(hit) else None


def trailing_rates(times: np.ndarray, done: np.ndarray, window_s: float) -> np.ndarray:
    """Per sample, (examples done now - done `window_s` before) / `window_s` (0 before a window)."""
    before = np.interp(times - window_s, times, done, left=np.nan)
    return np.nan_to_num((done - before) / window_s, nan=0.0)


def percentiles(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p99": None, "max": None}
    return {"p50": round(float(np.percentile(values, 50)), 1), "p99": round(float(np.percentile(values, 99)), 1),
            "max": round(max(values), 1)}


def is_back(fault: Fault, mark: object) -> bool:
    """Whether `mark`, the target's progress mark now (`Probe.mark`), says it works again: a
    trainer has published a push made after its successor started (or it was thawed); a
    shard wrote its stats, serving, after the fault, from another process than the one killed;
    a master holds the lock anew."""
    if mark is _UNKNOWN:
        return False
    if fault.mark_kind == "shard":
        return mark.serving and mark.at > fault.resumed_at and (fault.frozen or mark.pid != fault.pid)
    if fault.before is _UNKNOWN or fault.before is _PENDING:
        return False
    if fault.mark_kind == "trainer":
        return mark > fault.before
    return mark is not None and mark != fault.before


_UNKNOWN = object()  # a mark not readable now (a service away)
_PENDING = object()  # a mark not taken yet (the successor is not running)


# -------------------------------------------------------------------------- watching the job
@dataclass
class Fault:
    """One fault and when its target was back. Times are epoch seconds (the shards' stats say
    when they were written in those)."""

    kind: str  # a --faults kind; a freeze is named with what it froze ("freeze shard")
    target: str  # trainer id, shard index, "master" or the service
    at: float
    pid: int = 0  # the process hit
    mark_kind: str = ""  # whose progress says the target is back: trainer, shard or master
    resumed_at: float | None = None  # a freeze's SIGCONT; a kill's is its kill
    before: object = None  # the target's progress mark once its successor runs (_PENDING before)
    back_at: float | None = None
    rate_at: float | None = None
    rows: int | None = None  # a shard's: the rows it held when hit (its last stats)

    @property
    def frozen(self) -> bool:
        return self.kind.startswith("freeze")


def holds_schedule(faults: list[Fault], now: float) -> bool:
    """Whether a fault's target is still not back, at most `RECOVERING_S` after it: the next
    fault waits, so that each fault's time back is its own. (At a fault every 2 s without this,
    most of the slowest recoveries were of processes whose services or shards were hit while
    they restarted: bench/RESULTS.md.)"""
    return any(f.back_at is None and now - f.at < RECOVERING_S for f in faults)


class Probe:
    """What the job has done, read from Redis and etcd; a read that fails (a service away)
    says nothing."""

    def __init__(self, endpoints: Endpoints, job: str) -> None:
        self.endpoints, self.job = endpoints, job
        self.redis_keys, self.etcd_keys = RedisKeys(job), EtcdKeys(job)
        self._redis = redis_client(endpoints)
        self._nodes = ShardNodes(self._redis, job)
        self._etcd: Etcd | None = None

    def _each(self, key) -> list[bytes | None]:
        """`key(shard)` of every shard, read."""
        raw = self._nodes.get_each({s: key(s) for s in range(SHARDS)})
        return [raw[s] for s in range(SHARDS)]

    def applied(self) -> int | None:
        """Examples applied by the shard that has applied fewest."""
        try:
            raw = self._each(self.redis_keys.stats)
        except Exception:  # noqa: BLE001  Redis away
            return None
        if not all(raw):
            return None
        return min(ShardStats.from_json(r).examples for r in raw)

    def published(self) -> bool:
        """Whether every shard's parameters are in Redis: its version key, which a pull needs.
        After Redis restarts empty the first round that writes it again is the one that
        republishes everything (a shard checks the key every second)."""
        try:
            return all(self._each(self.redis_keys.version))
        except Exception:  # noqa: BLE001  Redis away
            return False

    def redis_port(self, shard: int) -> int:
        """The port of the Redis node holding `shard`'s keys now (the slots read anew: an
        earlier fault may have moved them)."""
        if self._nodes.cluster:
            self._redis.nodes_manager.initialize()
            self._nodes.forget()
        return self._nodes.node(shard).connection_pool.connection_kwargs["port"]

    def stats(self) -> list[ShardStats | None]:
        raw = self._each(self.redis_keys.stats)
        return [ShardStats.from_json(r) if r else None for r in raw]

    def mark(self, kind: str, target: str) -> object:
        """The target's progress mark (_UNKNOWN: not readable now). A trainer: the newest of its
        pushes the shards have published; a master: the create revision of the job's lock (a
        master that takes it again, even under the same identity, holds it anew); a shard:
        its stats (pid, serving, written at)."""
        try:
            if kind == "trainer":
                raw = self._each(self.redis_keys.applied)
                if not all(raw):  # Redis restarted empty: until the shards publish again
                    return _UNKNOWN
                return max(AppliedSteps.from_json(r).steps.get(target, -1) for r in raw)
            if kind == "shard":
                raw = self._redis.get(self.redis_keys.stats(int(target)))
                return ShardStats.from_json(raw) if raw else _UNKNOWN
            if kind == "master":
                entry = self._etcd_client().get(self.etcd_keys.master_lock)
                return entry.create_revision if entry else None
        except Exception:  # noqa: BLE001  a service away
            return _UNKNOWN
        raise ValueError(kind)

    def finished(self) -> bool:
        try:
            entry = self._etcd_client().get(self.etcd_keys.state)
        except EtcdError:
            return False
        return entry is not None and JobState.from_json(entry.value).finished

    def _etcd_client(self) -> Etcd:
        if self._etcd is None:
            self._etcd = Etcd.connect(self.endpoints)
        return self._etcd

    def close(self) -> None:
        self._redis.close()
        if self._etcd is not None:
            self._etcd.close()


@dataclass
class Run:
    name: str
    began: float
    wall_s: float
    applied: list[tuple[float, int]]
    faults: list[Fault] = field(default_factory=list)
    stats: list[dict] = field(default_factory=list)
    auc: dict = field(default_factory=dict)
    restarts: dict[str, int] = field(default_factory=dict)
    killed_at_stop: list[str] = field(default_factory=list)  # stopped by SIGKILL: maybe not flushed


class Chaos:
    """Runs one job under the supervisor, injecting `kinds` every `every_s` (none: fault-free)."""

    def __init__(self, local: LocalServices, home: Path, work: Workload, topic: str, records: int,
                 passes: int) -> None:
        self.local, self.home, self.work, self.topic = local, home, work, topic
        self.records, self.passes = records, passes
        self.endpoints = local.endpoints

    def run(self, name: str, kinds: list[str], every_s: float, timeout_s: float, seed: int) -> Run:
        job_file = self.home / f"{name}.toml"
        job_file.write_text(job_toml(name, self.topic, "csv", self.work, MODELS["widedeep"],
                                     self.home / "ckpt" / name, {"input": {"passes": str(self.passes)}}))
        config = JobConfig.from_toml(job_file.read_text())
        env = {"STREAMTRAIN_KAFKA": self.endpoints.kafka, "STREAMTRAIN_ETCD": self.endpoints.etcd,
               "STREAMTRAIN_REDIS": self.endpoints.redis}
        sup = Supervisor(COMMAND, env, self.home / "logs" / name, grace_s=30)
        sup.add("master", ["master", "--job", str(job_file)])
        for i in range(SHARDS):
            sup.add(f"shard-{i}", ["pserver", "--job", name, "--index", str(i)])
        for i in range(TRAINERS):
            sup.add(f"trainer-t{i}", trainer_args(name, i, TRAINERS, available(), f"t{i}"))
        probe = Probe(self.endpoints, name)
        began = time.time()
        applied: list[tuple[float, int]] = []
        faults: list[Fault] = []
        pending = list(kinds)
        next_fault: float | None = None
        frozen: list[tuple[float, Fault]] = []  # (SIGCONT at, fault)
        restarting: list[threading.Thread] = []
        self._restart_errors: list[BaseException] = []
        try:
            while True:
                now = time.time()
                if now - began > timeout_s:
                    raise RuntimeError(f"{name}: not finished after {timeout_s:.0f} s; logs in {sup.log_dir}")
                if self._restart_errors:
                    raise RuntimeError("a service did not come back") from self._restart_errors[0]
                for _ in sup.poll():
                    pass
                done = probe.applied()
                if done is not None:
                    applied.append((now, done))
                if next_fault is None and done:  # training under way: the schedule starts
                    next_fault = now + every_s
                for due in [f for f in frozen if f[0] <= now]:
                    _signal(due[1].pid, signal.SIGCONT)
                    due[1].resumed_at = time.time()
                    frozen.remove(due)
                for fault in faults:
                    if fault.back_at is None and fault.mark_kind and fault.resumed_at is not None:
                        self._watch(fault, sup, probe)
                if pending and next_fault is not None and now >= next_fault and not frozen and \
                        not any(t.is_alive() for t in restarting) and not holds_schedule(faults, now):
                    # Seeded by the fault's place: a retry picks the same target.
                    rng = random.Random(f"{seed}:{len(faults)}")
                    fault = self._inject(pending[0], sup, probe, rng, frozen, restarting)
                    if fault is None:  # its target is restarting: again in a moment
                        next_fault = now + 0.5
                    else:
                        faults.append(fault)
                        pending.pop(0)
                        next_fault = now + every_s
                if not frozen and not any(t.is_alive() for t in restarting) and probe.finished():
                    break
                time.sleep(SAMPLE_S)
            wall = time.time() - began
            for _ in range(int(30 / SAMPLE_S)):  # the shards' stats of the last examples
                if probe.applied() == self.records * self.passes:
                    break
                time.sleep(SAMPLE_S)
            stats = probe.stats()
            slot_map = SlotMap.from_json(probe._etcd_client().get(EtcdKeys(name).slots).value)
            killed = sup.stop()  # a stopping shard flushes its rows to their keys
            redis_conn = redis_client(self.endpoints)
            try:
                scores = Scorer(config, redis_conn, slot_map).score(examples(self.work.model, self.work.holdout))
            finally:
                redis_conn.close()
            return Run(name, began, wall, applied, faults, stats, quality(self.work, scores), sup.restarts, killed)
        finally:
            for _, fault in frozen:
                _signal(fault.pid, signal.SIGCONT)
            for thread in restarting:
                thread.join(120)
            sup.stop()
            probe.close()

    def _watch(self, fault: Fault, sup: Supervisor, probe: Probe) -> None:
        """Take the target's mark once its successor runs (a thawed process is its own), then
        see whether it is back."""
        if fault.before is _PENDING and fault.mark_kind != "shard":
            if not fault.frozen and not self._successor_runs(fault, sup):
                return
            fault.before = probe.mark(fault.mark_kind, fault.target)
            if fault.before is _UNKNOWN:
                fault.before = _PENDING  # again at the next sample
                return
        if is_back(fault, probe.mark(fault.mark_kind, fault.target)):
            fault.back_at = time.time()

    @staticmethod
    def _successor_runs(fault: Fault, sup: Supervisor) -> bool:
        if fault.kind == "master":
            return True  # the lock's revision, read now, is the killed master's or none
        trainer = sup.children[f"trainer-{fault.target}"].pid
        if fault.kind == "trainer":
            return trainer is not None and trainer != fault.pid
        return trainer is not None and any(pid != fault.pid for pid in children(trainer))  # a loader

    def _inject(self, kind: str, sup: Supervisor, probe: Probe, rng: random.Random,
                frozen: list, restarting: list) -> Fault | None:
        now = time.time()
        if kind in SERVICE_FAULTS:
            node = self._node(kind, probe, rng)
            server = self.local.servers[node]
            pid = server.pid()
            if pid is None:
                return None
            fault = Fault(kind, node, now, pid)
            _signal(pid, signal.SIGKILL)

            def restart() -> None:
                try:
                    while pid_alive(pid):
                        time.sleep(0.05)
                    time.sleep(SERVICE_DOWN_S)
                    server.start()
                    fault.resumed_at = time.time()
                    # Redis is back for the job once the shards have republished into it (it
                    # restarts empty); the next fault waits for that, up to RECOVERING_S.
                    while kind == "redis" and not probe.published():
                        if time.time() - now > RECOVERING_S:
                            return  # never back: the schedule goes on without it
                        time.sleep(0.1)
                    fault.back_at = time.time()
                except BaseException as exc:  # raised by the main loop
                    self._restart_errors.append(exc)

            thread = threading.Thread(target=restart, daemon=True)
            thread.start()
            restarting.append(thread)
            return fault
        if kind == "freeze":
            child = sup.children[rng.choice(sorted(sup.children))]
        elif kind == "loader":
            child = sup.children[f"trainer-t{rng.randrange(TRAINERS)}"]
        else:
            child = sup.children[rng.choice([n for n in sorted(sup.children) if n.startswith(kind)])]
        pid = child.pid
        if pid is None:
            return None
        target_kind = child.name.split("-")[0]
        target = child.name.split("-", 1)[1] if target_kind != "master" else "master"
        if kind == "loader":
            loaders = [(started, p) for p in children(pid) if (started := start_time(p)) is not None]
            if not loaders:
                return None
            pid = min(loaders)[1]  # the one reading: its standby is always younger (trainer/loader.py)
        fault = Fault(f"freeze {target_kind}" if kind == "freeze" else kind, target, now, pid, target_kind,
                      before=_PENDING)
        if target_kind == "shard":
            mark = probe.mark("shard", target)
            fault.rows = None if mark is _UNKNOWN else sum(mark.table_rows.values())
        if kind == "freeze":
            _signal(pid, signal.SIGSTOP)
            frozen.append((now + LEASE_S + FREEZE_PAST_LEASE_S, fault))
        else:
            fault.resumed_at = now
            _signal(pid, signal.SIGKILL)
        return fault


    def _node(self, kind: str, probe: Probe, rng: random.Random) -> str:
        """The node of a service to kill: the service itself, or one node of its cluster."""
        nodes = sorted(n for n in self.local.servers if n.split("-")[0] == kind)
        if len(nodes) == 1:
            return nodes[0]
        if kind == "etcd":
            return next((n for n in nodes if is_leader(self.local.servers[n].address)), rng.choice(nodes))
        if kind == "redis":
            port = probe.redis_port(rng.randrange(SHARDS))
            return next(n for n in nodes if self.local.servers[n].port == port)
        return rng.choice(nodes)


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


# -------------------------------------------------------------------------- the report
def expected_counts(records: int, topic: str, passes: int) -> dict[str, int]:
    """What each shard must have applied per partition: `write_topic` alternates partitions."""
    return {partition_label(topic, 0): (records + 1) // 2 * passes, partition_label(topic, 1): records // 2 * passes}


def ledger(stats: list[ShardStats | None], want: dict[str, int]) -> dict:
    """Examples lost and applied twice, over the shards and partitions (None: a shard that
    never wrote its stats, so applied nothing)."""
    lost = twice = 0
    for shard in stats:
        got = shard.examples_by_partition if shard is not None else {}
        for partition, n in want.items():
            diff = got.get(partition, 0) - n
            lost, twice = lost + max(0, -diff), twice + max(0, diff)
    return {"lost": lost, "applied_twice": twice, "dropped_groups": sum(s.dropped for s in stats if s is not None),
            "bad": sum(s.bad for s in stats if s is not None)}


def recovery(run: Run, reference_rate: float) -> dict[str, dict]:
    """Per fault kind: how many, and kill -> back / kill -> rate back above half, p50/p99 (s)."""
    times = np.array([t for t, _ in run.applied])
    done = np.array([n for _, n in run.applied], dtype=np.float64)
    rates = trailing_rates(times, done, WINDOW_S) if len(times) else np.array([])
    by_kind: dict[str, dict] = {}
    for fault in run.faults:
        fault.rate_at = first_at_or_above(times, rates, fault.at, 0.5 * reference_rate) if len(times) else None
        kinds = [fault.kind]
        if fault.kind == "shard" and (fault.rows or 0) >= BIG_SHARD_ROWS:
            kinds.append(f"shard {BIG_SHARD_ROWS // 1_000_000}M+ rows")
        for kind in kinds:
            entry = by_kind.setdefault(kind, {"count": 0, "back": [], "rate": [], "never_back": 0, "rate_never": 0})
            entry["count"] += 1
            if fault.back_at is None:
                entry["never_back"] += 1
            else:
                entry["back"].append(fault.back_at - (fault.resumed_at if fault.frozen else fault.at))
            if fault.rate_at is None:
                entry["rate_never"] += 1
            else:
                entry["rate"].append(fault.rate_at - fault.at)
    return {kind: {"count": e["count"], "never_back": e["never_back"], "rate_never": e["rate_never"],
                   "back_s": percentiles(e["back"]), "rate_s": percentiles(e["rate"])}
            for kind, e in sorted(by_kind.items())}


def fault_log(run: Run) -> list[dict]:
    """Each fault in order: when (s into the run), what, and its two recovery times."""
    def since(t: float | None, start: float) -> float | None:
        return None if t is None else round(t - start, 1)
    return [{"at_s": round(f.at - run.began, 1), "kind": f.kind, "target": f.target,
             "back_s": since(f.back_at, f.resumed_at if f.frozen and f.resumed_at else f.at),
             "rate_s": since(f.rate_at, f.at), **({} if f.rows is None else {"rows": f.rows})} for f in run.faults]


def under_schedule(run: Run, every_s: float) -> dict | None:
    """Examples a second from the first fault to `every_s` after the last one: the rate the
    job keeps while faults keep coming (the whole run's rate also counts the time after them)."""
    if not run.faults or len(run.applied) < 2:
        return None
    start, end = run.faults[0].at, run.faults[-1].at + every_s
    times = np.array([t for t, _ in run.applied])
    done = np.array([n for _, n in run.applied], dtype=np.float64)
    if times[-1] < end:  # the job finished first: up to its last sample
        end = float(times[-1])
    if end <= start:
        return None
    examples = float(np.interp(end, times, done) - np.interp(start, times, done))
    return {"seconds": round(end - start, 1), "examples_per_s": round(examples / (end - start))}


def table(report: dict) -> str:
    lines = [f"{'fault':<16} {'count':>5} {'back p50':>9} {'back p99':>9} {'rate p50':>9} {'rate p99':>9}",
             "-" * 62]
    for kind, r in report["chaos"]["recovery"].items():
        lines.append(f"{kind:<16} {r['count']:>5} {_s(r['back_s']['p50']):>9} {_s(r['back_s']['p99']):>9} "
                     f"{_s(r['rate_s']['p50']):>9} {_s(r['rate_s']['p99']):>9}")
    c, f = report["chaos"], report["fault_free"]
    lines.append("")
    lines.append(f"fault-free: {f['examples_per_s']} ex/s ({f['steady_examples_per_s']} steady), "
                 f"AUC {f['holdout_auc']:.4f}")
    lines.append(f"under chaos: {c['examples_per_s']} ex/s, {c['kept']:.0%} of fault-free; AUC {c['holdout_auc']:.4f} "
                 f"(gap {c['auc_gap']:+.4f}); lost {c['ledger']['lost']}, "
                 f"applied twice {c['ledger']['applied_twice']}, "
                 f"redone groups dropped {c['ledger']['dropped_groups']}")
    if c.get("under_schedule"):
        u = c["under_schedule"]
        lines.append(f"while faults came ({u['seconds']:.0f} s): {u['examples_per_s']} ex/s, "
                     f"{u['kept']:.0%} of the fault-free steady rate")
    lines.append("checks: " + ", ".join(f"{k} {'ok' if v else 'FAILED'}" for k, v in report["checks"].items()))
    return "\n".join(lines)


def _kept(rate: dict | None, steady: float) -> dict | None:
    return None if rate is None else {**rate, "kept": round(rate["examples_per_s"] / steady, 3)}


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", choices=sorted(PROFILES), default="ci")
    parser.add_argument("--records", type=int, help="training records (default: the profile's)")
    parser.add_argument("--holdout", type=int, default=50_000)
    parser.add_argument("--passes", type=int, help="passes of the job (default: the profile's)")
    parser.add_argument("--every-s", type=float, help="seconds between faults (default: the profile's)")
    parser.add_argument("--rounds", type=int, help="faults of each kind (default: the profile's)")
    parser.add_argument("--faults", nargs="+", choices=PROCESS_FAULTS + SERVICE_FAULTS,
                        help="fault kinds (default: the profile's)")
    parser.add_argument("--clusters", action="store_true",
                        help="run on 3 brokers, 3 etcd members and a Redis Cluster of 3 masters")
    parser.add_argument("--vocab-scale", type=int, default=1,
                        help="every field's vocabulary times this: more distinct ids, so larger shards "
                             "(4M records at 10 give each of 2 shards about 1M rows)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout-s", type=float, default=7200)
    parser.add_argument("--out", type=Path, help="also write the JSON report here")
    parser.add_argument("--keep", type=Path, metavar="DIR",
                        help="run in DIR and keep it: the services' data and every process's log "
                             "(default: a temporary directory, removed at the end)")
    args = parser.parse_args()
    profile = PROFILES[args.profile]
    records, passes = args.records or profile.records, args.passes or profile.passes
    every_s, kinds = args.every_s or profile.every_s, tuple(args.faults or profile.faults)
    started = time.monotonic()
    with contextlib.nullcontext(str(args.keep)) if args.keep else tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        home.mkdir(parents=True, exist_ok=True)
        ports = Ports.free(kafka_brokers=3, etcd_members=3, redis_masters=3) if args.clusters else Ports.free()
        local = LocalServices(home / "services", ports)
        if local.endpoints.external:
            raise SystemExit(f"bench.chaos kills its own services: unset STREAMTRAIN_"
                             f"{'/'.join(sorted(local.endpoints.external)).upper()}")
        local.up()
        try:
            topic = f"chaos-{time.time_ns() % 10**9}"
            work = write_log(local.endpoints, topic, records, args.holdout, vocab_scale=args.vocab_scale)
            chaos = Chaos(local, home, work, topic, records, passes)
            total = records * passes
            clean = chaos.run(f"chaos-clean-{time.time_ns() % 10**9}", [], every_s, args.timeout_s, args.seed)
            clean_steady = steady_rate(clean.applied, total)
            print(f"fault-free: {total / clean.wall_s:.0f} ex/s, AUC {clean.auc['holdout_auc']}", file=sys.stderr)
            faults = schedule(kinds, len(kinds) * (args.rounds or profile.rounds), args.seed)
            hit = chaos.run(f"chaos-{time.time_ns() % 10**9}", faults, every_s, args.timeout_s, args.seed)
        finally:
            local.down()
    want = expected_counts(records, topic, passes)
    books = ledger(hit.stats, want)
    gap = hit.auc["holdout_auc"] - clean.auc["holdout_auc"]
    recovered = recovery(hit, clean_steady)  # times each fault's rate recovery, for the log too
    report = {
        "profile": args.profile, "clusters": args.clusters, "records": records, "passes": passes, "every_s": every_s,
        "seed": args.seed,
        "vocab_scale": args.vocab_scale,
        "fault_free": {"wall_s": round(clean.wall_s, 1), "examples_per_s": round(total / clean.wall_s),
                       "steady_examples_per_s": round(clean_steady), **clean.auc,
                       "ledger": ledger(clean.stats, want)},
        "chaos": {"wall_s": round(hit.wall_s, 1), "examples_per_s": round(total / hit.wall_s),
                  "kept": round(clean.wall_s / hit.wall_s, 3), "faults": len(hit.faults),
                  "recovery": recovered, "restarts": hit.restarts, "ledger": books,
                  "under_schedule": _kept(under_schedule(hit, every_s), clean_steady),
                  "killed_at_stop": hit.killed_at_stop, "fault_log": fault_log(hit),
                  **hit.auc, "auc_gap": round(gap, 4)},
        "elapsed_s": round(time.monotonic() - started),
    }
    report["checks"] = {
        "every fault injected": len(hit.faults) == len(faults),
        "none lost": books["lost"] == 0,
        "none applied twice": books["applied_twice"] == 0,
        f"AUC at most {AUC_TOLERANCE} below": gap >= -AUC_TOLERANCE,
    }
    print(table(report))
    print(json.dumps(report, indent=2))
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    if not all(report["checks"].values()):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
