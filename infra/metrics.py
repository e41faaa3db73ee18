"""Prometheus metrics of every streamtrain process, and the HTTP exporter that serves them.

Every metric is named `streamtrain_<process>_…` and labelled with the `job`; trainer metrics
also carry the `trainer` id and pserver metrics the `shard` index, so several trainers or shards
in one process (as in the tests) stay apart. The metric families are created once per process
in prometheus-client's default registry; `MasterMetrics.for_job`, `TrainerMetrics.for_trainer`
and `PserverMetrics.for_shard` bind their labels. See docs/observability.md for every metric.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from socketserver import ThreadingMixIn
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram, make_wsgi_app

from streamtrain.schemas import ShardStats

PORT_ENV = "STREAMTRAIN_METRICS_PORT"

# Per mini-batch pulls and compute, per commit, per publish: milliseconds to seconds.
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
                   5.0, 10.0, 30.0)
# Event time to committed gradient: a live stream is seconds behind, a backfill hours or days.
FRESHNESS_BUCKETS = (0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0,
                     3600.0, 3 * 3600.0, 12 * 3600.0, 86400.0, 7 * 86400.0)
CHECKPOINT_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)


def metrics_port(port: int | None = None) -> int:
    """`port`, else $STREAMTRAIN_METRICS_PORT, else 0 (a free port)."""
    if port is not None:
        return port
    value = os.environ.get(PORT_ENV, "").strip()
    try:
        return int(value) if value else 0
    except ValueError:
        raise ValueError(f"{PORT_ENV}={value!r} is not a port number") from None


def serve_metrics(port: int | None = None, addr: str = "0.0.0.0", registry: CollectorRegistry = REGISTRY,
                  ready: Callable[[], bool] = lambda: True) -> int:
    """Serve `/metrics` (Prometheus text format), `/healthz` (200 while the process answers: a
    liveness probe) and `/readyz` (200 while `ready()`, else 503: a readiness probe) from a
    daemon thread; return the bound port. `port` None: $STREAMTRAIN_METRICS_PORT, else 0; 0
    picks a free port."""
    metrics = make_wsgi_app(registry)

    def app(environ, start_response):
        path = environ.get("PATH_INFO", "")
        if path in ("/healthz", "/readyz"):
            ok = path == "/healthz" or _asked(ready)
            start_response("200 OK" if ok else "503 Service Unavailable", [("Content-Type", "text/plain")])
            return [b"ok\n" if ok else b"not ready\n"]
        return metrics(environ, start_response)

    server = make_server(addr, metrics_port(port), app, _ThreadingServer, handler_class=_QuietHandler)
    threading.Thread(target=server.serve_forever, name="metrics-http", daemon=True).start()
    return int(server.server_address[1])


def _asked(ready: Callable[[], bool]) -> bool:
    try:
        return bool(ready())
    except Exception:  # noqa: BLE001  a probe answers; the process's own thread reports the error
        return False


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002  probes every few seconds
        pass


# -- metric families (one set per process) ----------------------------------------------------

class _MasterFamilies:
    def __init__(self) -> None:
        self.leader = Gauge("streamtrain_master_leader",
                            "1 while this master holds the job's lock, 0 while standby or stopped", ["job"])
        self.tasks = Gauge("streamtrain_master_tasks",
                           "Tasks per queue, as read at the start of the master's last round", ["job", "state"])
        self.input_lag = Gauge("streamtrain_master_input_lag_records",
                               "Offsets not yet trained: stable end of the partition minus the trained watermark",
                               ["job", "topic", "partition"])
        self.sliced = Counter("streamtrain_master_tasks_sliced", "Tasks created by slicing input partitions",
                              ["job"])
        self.requeued = Counter("streamtrain_master_tasks_requeued",
                                "Pending tasks whose trainer was lost or timed out, put back in todo", ["job"])
        self.members = Gauge("streamtrain_master_members", "Live members seen by the master", ["job", "kind"])


class _TrainerFamilies:
    def __init__(self) -> None:
        labels = ["job", "trainer"]
        self.examples = Counter("streamtrain_trainer_examples", "Examples trained (forward and backward)", labels)
        self.bad_records = Counter("streamtrain_trainer_bad_records",
                                   "Input records that failed to decode, sent to the DLQ", labels)
        self.tasks = Counter("streamtrain_trainer_tasks", "Tasks ended, by outcome (done, lost, failed, released)",
                             [*labels, "outcome"])
        self.pull = Histogram("streamtrain_trainer_pull_seconds",
                              "Parameter pull (rows, and dense blocks when due) per mini-batch", labels,
                              buckets=LATENCY_BUCKETS)
        self.compute = Histogram("streamtrain_trainer_compute_seconds",
                                 "Forward, backward and gradient accumulation per mini-batch", labels,
                                 buckets=LATENCY_BUCKETS)
        self.push = Histogram("streamtrain_trainer_push_seconds",
                              "Building and producing one push group's deltas, and the wait after it for pushes "
                              "in flight",
                              labels, buckets=LATENCY_BUCKETS)
        self.commit = Histogram("streamtrain_trainer_commit_seconds",
                                "Waiting for the broker's acknowledgement of the deltas handed, and a task's side "
                                "outputs' transaction", labels,
                                buckets=LATENCY_BUCKETS)
        self.loss = Gauge("streamtrain_trainer_task_loss", "Mean log loss of the last committed task", labels)
        self.auc = Gauge("streamtrain_trainer_task_auc",
                         "Prequential AUC of the last committed task that had both classes", labels)
        self.freshness = Histogram(
            "streamtrain_trainer_freshness_seconds",
            "Per task: commit time of its gradient minus the event time of its newest example", labels,
            buckets=FRESHNESS_BUCKETS)


class _PserverFamilies:
    def __init__(self) -> None:
        labels = ["job", "shard"]
        self.deltas = Counter("streamtrain_pserver_deltas_applied", "Gradient deltas applied", labels)
        self.rows = Counter("streamtrain_pserver_rows_applied", "Sparse rows updated by applied deltas", labels)
        self.dropped = Counter("streamtrain_pserver_duplicates_dropped",
                               "Deltas dropped as duplicates of an applied (task_id, seq)", labels)
        self.bad = Counter("streamtrain_pserver_bad_deltas", "Gradient messages sent to the DLQ", labels)
        self.examples = Counter("streamtrain_pserver_examples_applied",
                                "Examples whose gradients this shard applied", labels)
        self.publishes = Counter("streamtrain_pserver_publishes", "Publishes of changed rows to Redis", labels)
        self.rows_published = Counter("streamtrain_pserver_rows_published",
                                      "Rows written to Redis (a row changed many times between publishes counts once)",
                                      labels)
        self.republished = Counter("streamtrain_pserver_republished",
                                   "Full republishes (start-up, Redis lost its data)", labels)
        self.checkpoints = Counter("streamtrain_pserver_checkpoints", "Checkpoints written", labels)
        self.damped = Counter("streamtrain_pserver_dense_steps_damped",
                              "Dense steps applied at less than the full step: computed on a block that had "
                              "taken other steps since (train.damp_stale)", labels)
        self.publish = Histogram("streamtrain_pserver_publish_seconds",
                                 "Writing one batch of changed rows and blocks to Redis", labels,
                                 buckets=LATENCY_BUCKETS)
        self.checkpoint = Histogram("streamtrain_pserver_checkpoint_seconds", "Writing one checkpoint", labels,
                                    buckets=CHECKPOINT_BUCKETS)
        self.version = Gauge("streamtrain_pserver_version", "The shard's parameter version in Redis", labels)
        self.offset = Gauge("streamtrain_pserver_consumed_offset",
                            "Next gradient-topic offset to consume (everything before is applied)", labels)
        self.serving = Gauge("streamtrain_pserver_serving", "1 once recovery is done and the shard serves", labels)
        self.dedup_entries = Gauge("streamtrain_pserver_dedup_entries", "Tasks held in the dedup ledger", labels)


_families: dict[str, object] = {}
_families_lock = threading.Lock()


def _get(kind: str, make):
    # Created on first use, once per process: prometheus-client refuses a second registration,
    # and two trainers started at once in one process (tests, a notebook) both got here first.
    with _families_lock:
        if kind not in _families:
            _families[kind] = make()
        return _families[kind]


# -- per-process views --------------------------------------------------------------------------

@dataclass
class MasterMetrics:
    job: str
    leader: Gauge
    sliced: Counter
    requeued: Counter
    _f: _MasterFamilies = field(repr=False)

    @classmethod
    def for_job(cls, job: str) -> MasterMetrics:
        f = _get("master", _MasterFamilies)
        for state in ("todo", "pending", "done", "failed"):
            f.tasks.labels(job, state)
        return cls(job, f.leader.labels(job), f.sliced.labels(job), f.requeued.labels(job), f)

    def queues(self, **sizes: int) -> None:
        """Task counts per queue: queues(todo=…, pending=…, done=…, failed=…)."""
        for state, size in sizes.items():
            self._f.tasks.labels(self.job, state).set(size)

    def lag(self, topic: str, partition: int, records: int) -> None:
        self._f.input_lag.labels(self.job, topic, str(partition)).set(max(records, 0))

    def members(self, kind: str, count: int) -> None:
        self._f.members.labels(self.job, kind).set(count)


@dataclass
class TrainerMetrics:
    job: str
    trainer: str
    examples: Counter
    bad_records: Counter
    pull_seconds: Histogram
    compute_seconds: Histogram
    push_seconds: Histogram
    commit_seconds: Histogram
    loss: Gauge
    auc: Gauge
    freshness_seconds: Histogram
    _f: _TrainerFamilies = field(repr=False)

    @classmethod
    def for_trainer(cls, job: str, trainer: str) -> TrainerMetrics:
        f = _get("trainer", _TrainerFamilies)
        ls = (job, trainer)
        for outcome in ("done", "lost", "failed", "released"):
            f.tasks.labels(*ls, outcome)
        return cls(job, trainer, f.examples.labels(*ls), f.bad_records.labels(*ls), f.pull.labels(*ls),
                   f.compute.labels(*ls), f.push.labels(*ls), f.commit.labels(*ls), f.loss.labels(*ls),
                   f.auc.labels(*ls), f.freshness.labels(*ls), f)

    def task_ended(self, outcome: str) -> None:
        """outcome: done | lost | failed | released."""
        self._f.tasks.labels(self.job, self.trainer, outcome).inc()

    def task_committed(self, loss: float | None, auc: float | None, max_event_time_ms: int,
                       committed_at: float) -> None:
        """After a task's last commit: its loss and AUC (left as they were when undefined), and
        its freshness, `committed_at` (unix seconds) minus its newest example's event time."""
        if loss is not None:
            self.loss.set(loss)
        if auc is not None:
            self.auc.set(auc)
        if max_event_time_ms > 0:
            self.freshness_seconds.observe(max(committed_at - max_event_time_ms / 1000, 0.0))


# Fields of `ShardStats` that are cumulative counts, named as the families' attributes.
_STAT_COUNTERS = ("deltas", "rows", "dropped", "bad", "examples", "publishes", "rows_published",
                  "republished", "checkpoints", "damped")


@dataclass
class PserverMetrics:
    job: str
    shard: int
    publish_seconds: Histogram
    checkpoint_seconds: Histogram
    _f: _PserverFamilies = field(repr=False)
    _seen: dict[str, float] = field(default_factory=dict, repr=False)

    @classmethod
    def for_shard(cls, job: str, shard: int) -> PserverMetrics:
        f = _get("pserver", _PserverFamilies)
        ls = (job, str(shard))
        for family in vars(f).values():  # every series exists from the start, at 0
            family.labels(*ls)
        return cls(job, shard, f.publish.labels(*ls), f.checkpoint.labels(*ls), f)

    def observe_stats(self, stats: ShardStats) -> None:
        """Take a shard's `ShardStats`: its cumulative counts advance the counters by what
        they grew since the last call (a count that went down, e.g. a restored total, restarts
        the difference from there); version, offset, serving and ledger size set the gauges."""
        ls = (self.job, str(self.shard))
        for key in _STAT_COUNTERS:
            value = getattr(stats, key)
            grown = value - self._seen.get(key, 0)
            if grown > 0:
                getattr(self._f, key).labels(*ls).inc(grown)
            self._seen[key] = value
        for key, gauge in (("version", self._f.version), ("offset", self._f.offset),
                           ("dedup_entries", self._f.dedup_entries)):
            gauge.labels(*ls).set(getattr(stats, key))
        self._f.serving.labels(*ls).set(1 if stats.serving else 0)


def scrape(url: str, timeout: float = 10.0) -> dict[str, float]:
    """A /metrics page as {'name{label=value,...}': value}, parsed by prometheus-client."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    text = urllib.request.urlopen(url, timeout=timeout).read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            out[f"{sample.name}{{{labels}}}"] = sample.value
    return out
