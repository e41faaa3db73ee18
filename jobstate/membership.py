"""Who is in the job: trainers and pserver shards, each a key held by its own lease.

A pserver's index is the name of the key it creates, `ps/<index>`: the first index below
`ps_desired` whose key is absent, created in a transaction that requires it still absent (as
PaddlePaddle's distributed training design has it). Two shards starting at once can never
both get index 0, and a restarted shard gets its index back as soon as its old lease has
expired, or at once when the old holder is known dead (a process of this machine that no
longer runs: jobstate/predecessors.py).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field

from streamtrain.jobstate.errors import CoordinationError, NoFreeIndexError
from streamtrain.jobstate.etcd import Etcd, Lease, absent, put_op
from streamtrain.jobstate.predecessors import remove_if_gone, this_holder
from streamtrain.schemas import EtcdKeys, Holder
from streamtrain.schemas.config import JobConfig


def read_job_config(etcd: Etcd, job: str) -> JobConfig:
    """The config the job's master stored: what every trainer and pserver runs by.

    Raises:
        CoordinationError: no master has published the job yet.
        JobConfigError: the stored config does not validate.
    """
    entry = etcd.get(EtcdKeys(job).config)
    if entry is None:
        raise CoordinationError(f"job {job!r} has no config in etcd yet: start its master first")
    return JobConfig.from_json(entry.value, source=EtcdKeys(job).config)


def wait_for_job_config(etcd: Etcd, job: str, stop: threading.Event, log: logging.Logger) -> JobConfig | None:
    """The job's config once its master has published it; None if `stop` is set first."""
    while not stop.is_set():
        try:
            return read_job_config(etcd, job)
        except CoordinationError as exc:
            log.info("%s; waiting", exc)
            stop.wait(1.0)
    return None


def register_trainer(etcd: Etcd, job: str, trainer_id: str, ttl_s: int = 10) -> Lease:
    """Announce a trainer; the key lives as long as the returned (kept-alive) lease."""
    lease = etcd.lease(ttl_s).keep_alive()
    etcd.put(EtcdKeys(job).trainer(trainer_id), this_holder("trainer", trainer_id).to_json(), lease)
    return lease


def register_pserver(etcd: Etcd, job: str, address: str, ttl_s: int = 10,
                     wait_s: float = 0.0, index: int | None = None) -> tuple[int, Lease]:
    """Take the first free pserver index below ps_desired, or exactly `index`. Waits up to
    `wait_s` for one to free up (a restarted shard whose old lease has not expired yet).

    Raises:
        NoFreeIndexError: no index is free (or `index` is not below ps_desired) in time.
        SchemaError: ps_desired holds no shard count.
    """
    keys = EtcdKeys(job)
    deadline = time.monotonic() + wait_s
    while True:
        desired_entry = etcd.get(keys.ps_desired)
        desired = keys.ps_desired_of(desired_entry.value) if desired_entry else 0
        if index is not None and not 0 <= index < desired:
            raise NoFreeIndexError(f"pserver index {index} is outside job {job!r}'s {desired} shards")
        lease = etcd.lease(ttl_s)
        candidates = [index] if index is not None else list(range(desired))
        for candidate in candidates:
            ok, _ = etcd.txn([absent(keys.ps(candidate))],
                             [put_op(keys.ps(candidate), this_holder("pserver", str(candidate), address).to_json(),
                                     lease)])
            if ok:
                return candidate, lease.keep_alive()
        lease.revoke()
        if any([remove_if_gone(etcd, keys.ps(candidate)) for candidate in candidates]):
            continue  # a predecessor known dead held one: take it now, not after its lease
        if time.monotonic() >= deadline:
            taken = f"pserver index {index} is" if index is not None else f"all {desired} pserver indexes are"
            raise NoFreeIndexError(f"{taken} taken in job {job!r}")
        time.sleep(0.5)


@dataclass(frozen=True)
class Members:
    trainers: dict[str, Holder] = field(default_factory=dict)
    pservers: dict[int, Holder] = field(default_factory=dict)


def members(etcd: Etcd, job: str) -> Members:
    """The job's trainers and shards, each as it registered.

    Raises:
        SchemaError: a member key holds something this version did not write.
    """
    keys = EtcdKeys(job)
    trainers, pservers = etcd.ranges([keys.trainers_prefix, keys.ps_prefix])
    return Members(
        trainers={keys.trainer_of(e.key): Holder.from_json(e.value) for e in trainers},
        pservers={keys.ps_index_of(e.key): Holder.from_json(e.value) for e in pservers},
    )
