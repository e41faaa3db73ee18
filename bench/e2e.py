"""A whole job against the bare PyTorch loop a user would write, on the same records, in one run.

    python -m bench.e2e [--records 1000000] [--holdout 100000] [--model widedeep]
                        [--trainers 1 2] [--formats csv json] [--set train.push_every=2 ...]
                        [--bare-seeds 3] [--freshness-rate 5000] [--freshness-s 20] [--out report.json]

The workload looks like production CTR data (`ClickModelConfig.production()`: 8 fields with
Zipf ids and vocabularies from 10^3 to 10^6, 4 dense features, an ad x site interaction,
drift). The first `--records` impressions are the training log, the `--holdout` after them
score both models.

- **Bare loop**: one process, the examples as tensors in memory (ids hashed once, up front),
  `nn.Embedding(sparse=True)` tables under SparseAdam and the dense layers under Adam, one pass
  in log order. Written as a user would, with no streamtrain code in its loop. Run under
  `--bare-seeds` initialisations: its AUC alone moves by up to 0.006 with the seed here, so
  the reference AUC and mean prediction are the seeds' mean.
- **Job runs**: the log on a 2-partition topic as CSV and as JSON; for each format and each
  trainer count, a job over one bounded pass: a master, 2 pserver shards and N trainers as
  their own processes on local Kafka, etcd and Redis. The job file sets only what the workload
  and model need (fields, widths, `hash_buckets`, batch 512, Adam at 0.01, as the bare loop);
  `[train]` and `[tasks]` keep their defaults unless `--set` changes them.

Reported per run: examples/s in steady state (10%-90% of the records applied, from the shards'
stats) and including start-up, the ratio to the bare loop's speed (timed again after each job
run; the ratio is to the mean of its timings just before and just after the run), holdout AUC
and its gap to the bare loop's, mean predicted p against the observed CTR, CPU microseconds per
record of each process kind over the whole run and in the steady state, and peak RSS. Then **freshness**: event ->
visible in Redis, p50 and p99, on a live stream paced at `--freshness-rate` records/s
(`freshness`). Prints a table, then the JSON report (also to `--out`).

One module on purpose: a bench is read top to bottom as the record of what it measures, and
runs alone with `python -m`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pa_csv
import torch
import torch.nn.functional as F
from confluent_kafka import Producer
from torch import nn

from bench.trainer_throughput import cpu_seconds, write_topic
from streamtrain.infra import Endpoints, LocalServices, Ports
from streamtrain.infra.clients import TopicSpec, ensure_topics, redis_client
from streamtrain.infra.cpus import available
from streamtrain.jobstate.etcd import Etcd
from streamtrain.jobstate.sharding import SlotMap, mix64, name_salt
from streamtrain.local import trainer_args
from streamtrain.producers.clickmodel import ClickModel, ClickModelConfig, ImpressionColumns, auc
from streamtrain.schemas import EtcdKeys, Example, RedisKeys, ShardStats
from streamtrain.schemas.config import JobConfig
from streamtrain.trainer.features import Featurizer
from streamtrain.trainer.models import build_model, model_spec
from streamtrain.trainer.params import RowLayout
from streamtrain.trainer.scoring import Scorer

MODELS = {"lr": "streamtrain.trainer.models:LogisticRegression", "widedeep": "streamtrain.trainer.models:WideDeep",
          "deepfm": "streamtrain.trainer.models:DeepFM"}
EMBEDDING_DIM = 8
HASH_BUCKETS = 1 << 22
BATCH = 512
LEARNING_RATE = 0.01
LOG_CHUNK = 1_000_000  # records generated and written at a time by `write_log`


# -------------------------------------------------------------------------- the workload
@dataclass(frozen=True)
class Workload:
    model: ClickModel
    train: ImpressionColumns
    holdout: ImpressionColumns

    @classmethod
    def make(cls, records: int, holdout: int) -> Workload:
        model = ClickModel(ClickModelConfig.production())
        return cls(model, model.columns(records), model.columns(holdout, start=records))

    def csv_lines(self) -> list[bytes]:
        """One line per record: the fields' ids, the dense features, the label, the event time.
        Written by pyarrow's CSV writer, a dense feature as its float32's shortest text, which
        parses back to the value the bare loop trains on (and the JSON records carry); four
        times faster than formatting each cell in Python, which was most of writing a long log."""
        c = self.train
        columns = {f: c.ids[f] for f in self.model.fields}
        columns |= {f"d{j}": np.ascontiguousarray(c.dense[:, j]) for j in range(c.dense.shape[1])}
        columns |= {"clicked": c.clicked.astype(np.int8), "ts": c.index + self.model.config.origin_ms}
        sink = pa.BufferOutputStream()
        pa_csv.write_csv(pa.table(columns), sink, pa_csv.WriteOptions(include_header=False, quoting_style="none"))
        return sink.getvalue().to_pybytes().split(b"\n")[:-1]

    def csv_columns(self) -> list[str]:
        return ([f"{f}:sparse" for f in self.model.fields] + [f"d{j}:dense" for j in range(self.model.dense_features)]
                + ["clicked:label", "ts:time"])

    def json_records(self) -> list[bytes]:
        return [e.to_json() for e in examples(self.model, self.train)]


def write_log(endpoints: Endpoints, topic: str, records: int, holdout: int, chunk: int = LOG_CHUNK,
              vocab_scale: int = 1) -> Workload:
    """`Workload.make(records, holdout)`'s log written to a 2-partition `topic` as CSV without
    holding it all: generated and written `chunk` records at a time (13M records at once did
    not fit in 24 GiB; the records are the same, as a record depends only on its index). The
    Workload returned has the holdout and no training records. `chunk` is even, so the log
    alternates partitions as one `write_topic` call would. `vocab_scale`:
    `ClickModelConfig.production`'s."""
    if chunk % 2:
        raise ValueError(f"write_log: chunk {chunk} must be even")
    model = ClickModel(ClickModelConfig.production(vocab_scale=vocab_scale))
    for start in range(0, records, chunk):
        part = Workload(model, model.columns(min(chunk, records - start), start=start), model.columns(0))
        write_topic(endpoints, topic, part.csv_lines())
    return Workload(model, model.columns(0, start=records), model.columns(holdout, start=records))


def examples(model: ClickModel, c: ImpressionColumns) -> list[Example]:
    ids = [c.ids[f].tolist() for f in model.fields]
    dense, labels = c.dense.astype(np.float64).tolist(), c.clicked.astype(np.float64).tolist()
    times = (c.index + model.config.origin_ms).tolist()
    return [Example({f: (col[k],) for f, col in zip(model.fields, ids)}, tuple(dense[k]), labels[k], times[k])
            for k in range(len(labels))]


# -------------------------------------------------------------------------- the bare loop
class BareModel(nn.Module):
    """The model a user would write for one id per field: sparse embedding tables looked up by
    hashed id, the same dense layers as streamtrain's built-in of the same name."""

    def __init__(self, kind: str, fields: int, dense: int, dim: int, buckets: int) -> None:
        super().__init__()
        self.kind = kind
        self.first = nn.Embedding(buckets, 1, sparse=True)
        self.second = nn.Embedding(buckets, dim, sparse=True) if kind != "lr" else None
        for table in (self.first, self.second):
            if table is not None:
                nn.init.uniform_(table.weight, -0.01, 0.01)
        if kind == "lr":
            self.linear = nn.Linear(dense, 1)
        else:
            self.mlp = nn.Sequential(nn.Linear(fields * dim + dense, 64), nn.ReLU(), nn.Linear(64, 32), nn.ReLU(),
                                     nn.Linear(32, 1))

    def forward(self, idx: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:
        logit = self.first(idx).sum(dim=(1, 2))
        if self.kind == "lr":
            return logit + self.linear(dense).squeeze(1)
        v = self.second(idx)
        logit = logit + self.mlp(torch.cat([v.flatten(1), dense], dim=1)).squeeze(1)
        if self.kind == "deepfm":
            logit = logit + 0.5 * (v.sum(dim=1).pow(2) - v.pow(2).sum(dim=1)).sum(dim=1)
        return logit


def hashed(model: ClickModel, c: ImpressionColumns, buckets: int) -> torch.Tensor:
    """(n, fields) row indexes: the features the job trains on, each field's ids salted by the
    field and mixed by splitmix64, modulo the buckets (trainer/features.py). Done once before the
    loop, so that the two runs differ in how they train, not in their features."""
    idx = np.stack([mix64(c.ids[f].astype(np.uint64) ^ name_salt(f)) % np.uint64(buckets) for f in model.fields],
                   axis=1)
    return torch.from_numpy(idx.astype(np.int64))


def bare_loop(work: Workload, kind: str, seed: int = 0, score: bool = True) -> dict:
    """One pass of the bare loop over the training records; `score`: and its holdout quality."""
    torch.manual_seed(seed)
    torch.set_num_threads(1)
    model = BareModel(kind, len(work.model.fields), work.model.dense_features, EMBEDDING_DIM, HASH_BUCKETS)
    tables = [p for n, p in model.named_parameters() if n.endswith("weight") and p.dim() == 2
              and p.shape[0] == HASH_BUCKETS]
    dense_params = [p for p in model.parameters() if all(p is not t for t in tables)]
    sparse_opt = torch.optim.SparseAdam(tables, lr=LEARNING_RATE)
    dense_opt = torch.optim.Adam(dense_params, lr=LEARNING_RATE)
    idx, dense = hashed(work.model, work.train, HASH_BUCKETS), torch.from_numpy(work.train.dense)
    labels = torch.from_numpy(work.train.clicked.astype(np.float32))
    began, cpu = time.perf_counter(), time.process_time()
    for i in range(0, len(labels), BATCH):
        loss = F.binary_cross_entropy_with_logits(model(idx[i:i + BATCH], dense[i:i + BATCH]), labels[i:i + BATCH])
        sparse_opt.zero_grad()
        dense_opt.zero_grad()
        loss.backward()
        sparse_opt.step()
        dense_opt.step()
    wall, cpu = time.perf_counter() - began, time.process_time() - cpu
    records = len(labels)
    out = {"run": "bare loop", "examples_per_s": round(records / wall), "train_s": round(wall, 1),
           "cpu_us_per_record": {"bare loop": round(cpu / records * 1e6, 1)}}
    if not score:
        return out
    with torch.no_grad():
        scores = torch.sigmoid(model(hashed(work.model, work.holdout, HASH_BUCKETS),
                                     torch.from_numpy(work.holdout.dense))).numpy()
    return out | quality(work, scores)


def bare_reference(work: Workload, kind: str, seeds: int) -> dict:
    """The bare loop under `seeds` initialisations: the first's speed and CPU, the mean of their
    AUCs and mean predictions (each run also listed). One process's AUC moves by up to 0.006
    with the seed alone on this workload, as much as the gaps being judged."""
    runs = [bare_loop(work, kind, seed) for seed in range(seeds)]
    out = dict(runs[0])
    ctr = out["observed_ctr"]
    out["holdout_auc"] = round(float(np.mean([r["holdout_auc"] for r in runs])), 4)
    out["mean_p"] = round(float(np.mean([r["mean_p"] for r in runs])), 4)
    out["mean_p_error"] = round(out["mean_p"] / ctr - 1, 3)
    out["by_seed"] = [{"seed": seed, "holdout_auc": r["holdout_auc"], "mean_p": r["mean_p"]}
                      for seed, r in enumerate(runs)]
    return out


def quality(work: Workload, scores: np.ndarray) -> dict:
    ctr = float(work.holdout.clicked.mean())
    return {"holdout_auc": round(auc(work.holdout.clicked, scores), 4), "mean_p": round(float(scores.mean()), 4),
            "observed_ctr": round(ctr, 4), "mean_p_error": round(float(scores.mean()) / ctr - 1, 3)}


# -------------------------------------------------------------------------- a job run
def job_toml(name: str, topic: str, fmt: str, work: Workload, model: str, ckpt: Path,
             overrides: dict[str, dict[str, str]]) -> str:
    sections: dict[str, dict[str, str]] = {
        "job": {"name": json.dumps(name)},
        "input": {"topics": json.dumps([topic]), "passes": "1", "format": json.dumps(fmt)},
        "model": {"factory": json.dumps(model), "sparse_fields": json.dumps(list(work.model.fields)),
                  "dense_features": str(work.model.dense_features), "embedding_dim": str(EMBEDDING_DIM),
                  "hash_buckets": str(HASH_BUCKETS), "batch_size": str(BATCH)},
        "train": {"learning_rate": str(LEARNING_RATE)},
        "pservers": {"count": "2", "optimizer": json.dumps("adam"), "checkpoint_uri": json.dumps(ckpt.as_uri())},
    }
    if fmt == "csv":
        sections["input"]["csv_columns"] = json.dumps(work.csv_columns())
    for section, values in overrides.items():
        sections.setdefault(section, {}).update(values)
    return "".join(f"[{s}]\n" + "".join(f"{k} = {v}\n" for k, v in values.items()) for s, values in sections.items())


def proc_stat(pid: int) -> tuple[float, int] | None:
    """(CPU seconds used, peak RSS in bytes) of a live process."""
    used = cpu_seconds({"p": pid}).get("p")
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    if used is None:
        return None
    return used, next((int(line.split()[1]) * 1024 for line in status.splitlines() if line.startswith("VmHWM:")), 0)


def start_time(pid: int) -> int | None:
    """When `pid` started, in clock ticks since boot (None: gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])  # field 22; the name before ")" may hold spaces


def children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            pass
    return found


class Usage:
    """CPU and peak RSS per process kind, sampled while the run goes (a process's figures are
    read for the last time while it still lives)."""

    def __init__(self, kinds: dict[str, list[int]]) -> None:
        self.kinds = kinds
        self.baseline = {pid: s[0] for pids in kinds.values() for pid in pids if (s := proc_stat(pid))}
        self.last: dict[int, tuple[float, int]] = {}

    def sample(self, trainer_pids: list[int]) -> dict[str, float]:
        """Samples every process; returns the CPU seconds used so far per kind."""
        self.kinds["loader"] = sorted(set(self.kinds.get("loader", []))
                                      | {c for t in trainer_pids for c in children(t)})
        for pids in self.kinds.values():
            for pid in pids:
                stat = proc_stat(pid)
                if stat is not None:
                    self.last[pid] = stat
        return {kind: sum(self.last[p][0] - self.baseline.get(p, 0.0) for p in pids if p in self.last)
                for kind, pids in self.kinds.items()}

    def report(self, records: int) -> tuple[dict[str, float], dict[str, float]]:
        cpu, rss = {}, {}
        for kind, pids in self.kinds.items():
            used = [self.last[p][0] - self.baseline.get(p, 0.0) for p in pids if p in self.last]
            cpu[kind] = round(sum(used) / records * 1e6, 1)
            rss[kind] = round(max((self.last[p][1] for p in pids if p in self.last), default=0) / 2**20)
        return cpu, rss


def applied(redis_conn, job: str) -> int:
    """Examples applied by the shard that has applied fewest (each applies every example)."""
    counts = []
    for shard in range(2):
        raw = redis_conn.get(RedisKeys(job).stats(shard))
        counts.append(ShardStats.from_json(raw).examples if raw else 0)
    return min(counts)


def job_run(endpoints: Endpoints, services: dict[str, int], work: Workload, fmt: str, topic: str, trainers: int,
            model: str, home: Path, overrides: dict[str, dict[str, str]], timeout_s: float) -> dict:
    name = f"e2e-{fmt}-{trainers}t-{time.time_ns() % 10**9}"
    job_file = home / f"{name}.toml"
    job_file.write_text(job_toml(name, topic, fmt, work, model, home / "ckpt" / name, overrides))
    config = JobConfig.from_toml(job_file.read_text())
    log = open(home / f"{name}.log", "ab")
    records = len(work.train.clicked)
    redis_conn, etcd = redis_client(endpoints), Etcd.connect(endpoints)
    began = time.monotonic()
    procs = start_job(endpoints, job_file, name, trainers, log)
    # `services`: the services' pids by name, for their CPU; empty when they are not ours to watch.
    usage = Usage({kind: [services[name]] for kind, name in (("broker", "kafka"), ("redis", "redis"), ("etcd", "etcd"))
                   if name in services} | {kind: [p.pid for p in ps] for kind, ps in procs.items()})
    progress: list[tuple[float, int]] = []
    used: list[dict[str, float]] = []  # CPU seconds per kind at each progress sample
    try:
        while True:
            now, done = time.monotonic(), applied(redis_conn, name)
            progress.append((now, done))
            used.append(usage.sample([p.pid for p in procs["trainer"]]))
            if done >= records:
                break
            dead = [kind for kind, ps in procs.items() for p in ps if p.poll() is not None]
            if dead or now - began > timeout_s:
                raise RuntimeError(f"{name}: {'stopped: ' + ', '.join(dead) if dead else 'timed out'}; "
                                   f"see {home / (name + '.log')}")
            time.sleep(0.5)
        wall = time.monotonic() - began
        slot_map = SlotMap.from_json(etcd.get(EtcdKeys(name).slots).value)
        # Scored once the job has stopped, as a user's `streamtrain predict` after it: a
        # stopping shard flushes its rows to their keys, which lag its rounds while it runs.
        stop_job(procs)
        scores = Scorer(config, redis_conn, slot_map).score(examples(work.model, work.holdout))
    finally:
        stop_job(procs)
        log.close()
        redis_conn.close()
        etcd.close()
    cpu, rss = usage.report(records)
    return {"run": f"job {fmt}, {trainers} trainer{'s' * (trainers > 1)}", "format": fmt, "trainers": trainers,
            "examples_per_s": steady_rate(progress, records), "examples_per_s_with_startup": round(records / wall),
            "wall_s": round(wall, 1), "cpu_us_per_record": cpu,
            "steady_cpu_us_per_record": steady_cpu(progress, used, records), "peak_rss_mib": rss,
            **quality(work, scores)}


def start_job(endpoints: Endpoints, job_file: Path, name: str, trainers: int, log) -> dict[str, list[subprocess.Popen]]:
    """A master, 2 shards and `trainers` trainers as their own processes, logging to `log`;
    each trainer on its share of the CPUs, as `job run` places them (`local.trainer_args`)."""
    env = dict(os.environ, STREAMTRAIN_KAFKA=endpoints.kafka, STREAMTRAIN_ETCD=endpoints.etcd,
               STREAMTRAIN_REDIS=endpoints.redis)

    def start(*args: str) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "streamtrain", *args], env=env, stdout=log,
                                stderr=subprocess.STDOUT)

    return {"master": [start("master", "--job", str(job_file))],
            "shard": [start("pserver", "--job", name, "--index", str(i)) for i in range(2)],
            "trainer": [start(*trainer_args(name, i, trainers, available(), f"t{i}")) for i in range(trainers)]}


def stop_job(procs: dict[str, list[subprocess.Popen]]) -> None:
    for p in (p for ps in procs.values() for p in ps):
        p.terminate()
    for p in (p for ps in procs.values() for p in ps):
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()


# -------------------------------------------------------------------------- freshness
PROBE_EVERY = 50  # one probe record in so many


def freshness(endpoints: Endpoints, work: Workload, trainers: int, model: str, home: Path, rate: int,
              seconds: float) -> dict:
    """Event -> visible in Redis on a live stream paced at `rate` records/s, from outside.

    A job follows an empty topic (`input.passes = 0`, `[train]` and `[tasks]` at their
    defaults); the log's records are written to it at `rate` for `seconds`. Every
    PROBE_EVERY-th record is a probe: its first field holds an id no other record hashes to, and
    its event time is when it is written. A probe is visible once the row of that id is in
    Redis, which happens when a shard publishes the push of the mini-batch that trained it:
    the whole path (task cut at the head of the stream, claim, read, train, commit, apply,
    publish). A poller reads the probes' rows every 2 ms."""
    name = f"e2e-fresh-{trainers}t-{time.time_ns() % 10**9}"
    topic = f"{name}-log"
    ensure_topics(endpoints, [TopicSpec(topic, 2)])
    job_file = home / f"{name}.toml"
    job_file.write_text(job_toml(name, topic, "csv", work, model, home / "ckpt" / name, {"input": {"passes": "0"}}))
    config = JobConfig.from_toml(job_file.read_text())
    count = int(rate * seconds)
    lines = work.csv_lines()[:count]
    spec = model_spec(config)
    featurizer = Featurizer(spec.fields, spec.dense_features, config.model.hash_buckets)
    head = ImpressionColumns(*(value[:count] if isinstance(value, np.ndarray) else
                               {f: ids[:count] for f, ids in value.items()}
                               for value in vars(work.train).values()))
    taken = set(featurizer.batch(examples(work.model, head)).ids.tolist())
    table = RowLayout.of(build_model(config).tables).name
    keys = RedisKeys(name)
    probes: dict[int, tuple[int, list[str]]] = {}  # record index -> (row id, line's cells)
    candidate = 1 << 40
    for i in range(0, count, PROBE_EVERY):
        while True:
            candidate += 1
            row = int(featurizer.batch([Example({f: (candidate if j == 0 else 0,) for j, f in enumerate(spec.fields)},
                                                (0.0,) * spec.dense_features, 0.0, 0)]).ids[0])
            if row not in taken:
                taken.add(row)
                break
        cells = lines[i].decode().split(",")
        cells[0] = str(candidate)
        probes[i] = (row, cells)

    log = open(home / f"{name}.log", "ab")
    redis_conn, etcd = redis_client(endpoints), Etcd.connect(endpoints)
    procs = start_job(endpoints, job_file, name, trainers, log)
    written: list[tuple[str, float]] = []  # (row key, when its probe was written: its event time)
    seen: dict[str, float] = {}
    done = threading.Event()

    def poll() -> None:
        """Until every probe is visible, or 10 s after the last was written."""
        while True:
            pending = [key for key, _ in written[:] if key not in seen]
            now = time.time()
            if pending:
                pipe = redis_conn.pipeline(transaction=False)  # one key a slot: a cluster's too
                for key in pending:
                    pipe.get(key)
                for key, value in zip(pending, pipe.execute()):
                    if value is not None:
                        seen[key] = now
            elif done.is_set():
                return
            if done.is_set() and now > written[-1][1] + 10:
                return
            time.sleep(0.002)

    try:
        deadline = time.monotonic() + 120
        while not (all(redis_conn.exists(keys.version(s)) for s in range(2))
                   and len(etcd.range(EtcdKeys(name).trainers_prefix, keys_only=True)) == trainers):
            if time.monotonic() > deadline or any(p.poll() is not None for ps in procs.values() for p in ps):
                raise RuntimeError(f"{name}: the job did not start; see {home / (name + '.log')}")
            time.sleep(0.2)
        time.sleep(2.0)  # the trainers' loaders and first claims
        slot_map = SlotMap.from_json(etcd.get(EtcdKeys(name).slots).value)
        for i, (row, cells) in probes.items():
            probes[i] = (keys.row(int(slot_map.shard_of_rows(table, np.array([row], dtype=np.uint64))[0]), table, row),
                         cells)
        poller = threading.Thread(target=poll, daemon=True)
        poller.start()
        producer = Producer({"bootstrap.servers": endpoints.kafka, "linger.ms": 5, "enable.idempotence": True})
        began = time.monotonic()
        for i, line in enumerate(lines):
            wait = began + i / rate - time.monotonic()  # record i goes out at began + i / rate
            if wait > 0:
                time.sleep(wait)
            probe = probes.get(i)
            if probe is not None:
                key, cells = probe
                at = time.time()
                cells[-1] = str(int(at * 1000))
                line = ",".join(cells).encode()
                written.append((key, at))
            producer.produce(topic, line, partition=i % 2)
            producer.poll(0)
        producer.flush(30)
        done.set()
        poller.join(60)
    finally:
        done.set()
        stop_job(procs)
        log.close()
        redis_conn.close()
        etcd.close()
    delays = np.array([seen[k] - t for k, t in written if k in seen])
    pct = (lambda q: round(float(np.percentile(delays, q)), 3)) if len(delays) else (lambda q: None)
    return {"run": f"freshness, {trainers} trainers", "rate": rate, "seconds": seconds, "probes": len(written),
            "visible": len(delays), "p50_s": pct(50), "p99_s": pct(99),
            "max_s": round(float(delays.max()), 3) if len(delays) else None}


def steady_rate(progress: list[tuple[float, int]], records: int) -> int:
    """Examples/s between 10% and 90% of the records applied."""
    t = np.array([p[0] for p in progress])
    n = np.array([p[1] for p in progress], dtype=np.float64)
    lo, hi = np.interp([0.1 * records, 0.9 * records], n, t) if n[-1] > n[0] else (t[0], t[-1])
    return round(0.8 * records / max(hi - lo, 1e-9))


def steady_cpu(progress: list[tuple[float, int]], used: list[dict[str, float]], records: int) -> dict[str, float]:
    """CPU microseconds per record of each kind between the samples nearest 10% and 90% of
    the records applied: what bounds the steady rate, without start-up and shut-down."""
    done = np.array([p[1] for p in progress])
    lo = int(np.searchsorted(done, 0.1 * records))
    hi = min(int(np.searchsorted(done, 0.9 * records)), len(done) - 1)
    if hi <= lo or done[hi] <= done[lo]:
        return {}
    n = done[hi] - done[lo]
    out = {kind: round((used[hi].get(kind, 0.0) - used[lo].get(kind, 0.0)) / n * 1e6, 1) for kind in used[hi]}
    out["total"] = round(sum(out.values()), 1)
    return out


# -------------------------------------------------------------------------- report
def table(runs: list[dict], bare: dict) -> str:
    """A line per run; a job's ratio is to the bare loop timed around it (`bare ex/s`)."""
    head = (f"{'run':<24} {'ex/s':>8} {'bare ex/s':>15} {'ratio':>6} {'ex/s all':>9} {'AUC':>7} {'gap':>7} "
            f"{'mean p':>7} {'CTR':>6}  CPU us/record, steady")
    lines = [head, "-" * len(head)]
    for r in [bare, *runs]:
        around = "/".join(str(v) for v in r.get("bare_examples_per_s", [r["examples_per_s"]]))
        cpu = " ".join(f"{k} {v:g}" for k, v in (r.get("steady_cpu_us_per_record") or r["cpu_us_per_record"]).items())
        lines.append(f"{r['run']:<24} {r['examples_per_s']:>8} {around:>15} {r.get('ratio', 1.0):>6.2f} "
                     f"{r.get('examples_per_s_with_startup', ''):>9} {r['holdout_auc']:>7.4f} "
                     f"{r['holdout_auc'] - bare['holdout_auc']:>+7.4f} {r['mean_p']:>7.4f} "
                     f"{r['observed_ctr']:>6.3f}  {cpu}")
    return "\n".join(lines)


def parse_sets(items: list[str]) -> dict[str, dict[str, str]]:
    """`section.key=value` (value as TOML) into {section: {key: value}}."""
    out: dict[str, dict[str, str]] = {}
    for item in items:
        key, sep, value = item.partition("=")
        section, dot, name = key.partition(".")
        if not sep or not dot or not section or not name:
            raise SystemExit(f"--set {item!r}: expected section.key=value, e.g. train.push_every=2")
        out.setdefault(section, {})[name] = value
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--holdout", type=int, default=100_000)
    parser.add_argument("--model", choices=sorted(MODELS), default="widedeep")
    parser.add_argument("--trainers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--formats", nargs="+", choices=["csv", "json"], default=["csv", "json"])
    parser.add_argument("--set", dest="sets", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="a job-file setting for every job run (TOML value), e.g. train.push_every=2")
    parser.add_argument("--timeout-s", type=float, default=900, help="per job run")
    parser.add_argument("--bare-seeds", type=int, default=3,
                        help="initialisations of the bare loop; the reference AUC is their mean")
    parser.add_argument("--freshness-rate", type=int, default=5000, help="records/s of the live freshness run")
    parser.add_argument("--freshness-s", type=float, default=20, help="its length; 0: no freshness run")
    parser.add_argument("--out", type=Path, help="also write the JSON report here")
    args = parser.parse_args()
    if args.bare_seeds < 1:
        raise SystemExit("--bare-seeds: at least 1")
    overrides = parse_sets(args.sets)
    started = time.monotonic()
    work = Workload.make(args.records, args.holdout)
    bare = bare_reference(work, args.model, args.bare_seeds)
    print(f"bare loop: {bare['examples_per_s']} ex/s, AUC {bare['holdout_auc']} "
          f"({', '.join(str(r['holdout_auc']) for r in bare['by_seed'])} by seed)", file=sys.stderr)
    runs: list[dict] = []
    before = bare["examples_per_s"]
    fresh: dict | None = None
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        local = LocalServices(home / "services", Ports.free())
        local.up()
        try:
            endpoints = local.endpoints
            services = {name: server.pid() for name, server in local.servers.items()}
            for fmt in args.formats:
                topic = f"e2e-{fmt}-{time.time_ns() % 10**9}"
                write_topic(endpoints, topic, work.csv_lines() if fmt == "csv" else work.json_records())
                for trainers in args.trainers:
                    run = job_run(endpoints, services, work, fmt, topic, trainers, MODELS[args.model], home,
                                  overrides, args.timeout_s)
                    # The machine's speed drifts over minutes (by half, on a shared host): each
                    # run is compared with the bare loop timed just before it and just after.
                    after = bare_loop(work, args.model, score=False)["examples_per_s"]
                    run["bare_examples_per_s"] = [before, after]
                    run["ratio"] = round(run["examples_per_s"] / np.mean([before, after]), 3)
                    before = after
                    run["auc_gap"] = round(run["holdout_auc"] - bare["holdout_auc"], 4)
                    runs.append(run)
                    print(f"{run['run']}: {run['examples_per_s']} ex/s, AUC {run['holdout_auc']}", file=sys.stderr)
            if args.freshness_s > 0:
                fresh = freshness(endpoints, work, max(args.trainers), MODELS[args.model], home, args.freshness_rate,
                                  args.freshness_s)
        finally:
            local.down()
    report = {"workload": {"records": args.records, "holdout": args.holdout, "model": MODELS[args.model],
                           "fields": len(work.model.fields), "dense_features": work.model.dense_features,
                           "embedding_dim": EMBEDDING_DIM, "hash_buckets": HASH_BUCKETS, "batch_size": BATCH,
                           "optimizer": "adam", "learning_rate": LEARNING_RATE, "shards": 2, "settings": overrides},
              "bare": bare, "runs": runs, "freshness": fresh, "elapsed_s": round(time.monotonic() - started)}
    print(table(runs, bare))
    seeds = ", ".join(f"{r['holdout_auc']:.4f}" for r in bare["by_seed"])
    print(f"bare loop AUC by seed: {seeds} (the reference: their mean)")
    if fresh is not None:
        print(f"event -> visible in Redis, {fresh['run']} at {fresh['rate']} records/s: p50 {fresh['p50_s']} s, "
              f"p99 {fresh['p99_s']} s, max {fresh['max_s']} s ({fresh['visible']} of {fresh['probes']} probes)")
    print(json.dumps(report, indent=2))
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
