"""`streamtrain`: flags and environment are read here and nowhere else.

One module on purpose: each command is a typer declaration of its flags and a few lines that
call the module doing the work (a component, an operation, `LocalJob`, the console), and
keeping them together keeps the whole command line readable in one place, as docs/cli.md
mirrors it. The last part of the top package: only `streamtrain/__main__.py` imports it
(tests/unit/test_layers.py)."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from streamtrain.infra import Endpoints, InfraError, LocalServices, Ports
from streamtrain.infra.endpoints import recorded_ports, state_home
from streamtrain.infra.signals import stop_on_signals

if TYPE_CHECKING:
    from streamtrain.schemas.config import JobConfig

app = typer.Typer(
    name="streamtrain",
    help="Streaming, fault-tolerant distributed training on Kafka, etcd and Redis.",
    no_args_is_help=True,
    add_completion=False,
)
console = Console()
err = Console(stderr=True)

HomeOpt = Annotated[
    Optional[Path],
    typer.Option("--home", help="State dir of the local services [env: STREAMTRAIN_HOME].",
                 show_default=False),
]


def _services(home: Path | None, port_base: int | None = None, registry: bool = False,
              etcd_members: int | None = None, kafka_brokers: int | None = None,
              redis_cluster: int | None = None) -> LocalServices:
    home = home or state_home()
    ports = Ports.from_base(port_base) if port_base is not None else None
    sizes = [("--etcd-members", etcd_members, Ports.with_etcd_members),
             ("--kafka-brokers", kafka_brokers, Ports.with_kafka_brokers),
             ("--redis-cluster", redis_cluster, Ports.with_redis_cluster)]
    for hint, size, sized in sizes:
        if size is not None:
            ports = ports or recorded_ports(home) or Ports.default()
            try:
                ports = sized(ports, size)
            except ValueError as exc:
                raise typer.BadParameter(str(exc), param_hint=hint) from exc
    return LocalServices(home, ports, registry=registry)


@app.command()
def up(
    home: HomeOpt = None,
    port_base: Annotated[Optional[int], typer.Option(
        "--port-base", help="Kafka on BASE, its controller BASE+1, etcd BASE+2 (peer BASE+3), "
        "Redis BASE+4, the schema registry BASE+5 [env: STREAMTRAIN_PORT_BASE; default 19092].",
        show_default=False)] = None,
    registry: Annotated[bool, typer.Option(
        "--registry", help="Also start a schema registry (Confluent's API, for Avro topics).")] = False,
    etcd_members: Annotated[Optional[int], typer.Option(
        "--etcd-members", help="Run etcd as a cluster of this many members (the others on BASE+12/13, "
        "BASE+22/23, ...) [default: as the last `up`, else 1].", show_default=False)] = None,
    kafka_brokers: Annotated[Optional[int], typer.Option(
        "--kafka-brokers", help="Run Kafka as a cluster of this many brokers (the others on BASE+10/11, "
        "BASE+20/21, ...) [default: as the last `up`, else 1].", show_default=False)] = None,
    redis_cluster: Annotated[Optional[int], typer.Option(
        "--redis-cluster", help="Run Redis as a Redis Cluster of this many masters, 3 to 5, each with a "
        "replica (the other nodes on BASE+14, BASE+24, ...); 0: a single Redis [default: as the last `up`, "
        "else 0].", show_default=False)] = None,
) -> None:
    """Start local Kafka, etcd and Redis (those not already running), and a schema registry
    when asked; wait until healthy."""
    services = _services(home, port_base, registry, etcd_members, kafka_brokers, redis_cluster)
    try:
        started = services.up()
    except InfraError as exc:
        err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(1) from exc
    for status in services.status():
        took = started.get(status.name)
        how = ("external" if status.external else
               "already running" if took is None else f"ready in {took:.1f} s")
        console.print(f"{status.name:8} {how:18} {status.address}")


@app.command()
def down(home: HomeOpt = None) -> None:
    """Stop the local services (data is kept for the next `up`)."""
    stopped = _services(home).down()
    console.print(f"stopped: {', '.join(stopped)}" if stopped else "nothing was running")


@app.command()
def services(
    home: HomeOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print address and health as JSON.")] = False,
) -> None:
    """Show each service's address, pid and health. Exits 1 if any is unhealthy."""
    statuses = _services(home).status()
    if as_json:
        print(json.dumps({s.name: s.as_dict() for s in statuses}, indent=2))
    else:
        table = Table("service", "address", "pid", "health")
        for s in statuses:
            health = "[green]healthy[/green]" if s.healthy else "[red]down[/red]"
            table.add_row(s.name, s.address, "external" if s.external else str(s.pid or "-"), health)
        console.print(table)
    if not all(s.healthy for s in statuses):
        raise typer.Exit(1)


@app.command()
def demo(
    home: HomeOpt = None,
    port_base: Annotated[Optional[int], typer.Option(
        "--port-base", help="Ports of the local services, as for `up` [env: STREAMTRAIN_PORT_BASE].",
        show_default=False)] = None,
    duration: Annotated[Optional[float], typer.Option(
        "--duration", help="Stop after this many seconds (default: run until Ctrl-C).",
        show_default=False)] = None,
    headless: Annotated[bool, typer.Option(
        "--headless", help="Print a plain status line every few seconds instead of the live view.")] = False,
    keep: Annotated[bool, typer.Option("--keep", help="Leave the services running.")] = False,
    resize: Annotated[Optional[list[str]], typer.Option(
        "--resize", metavar="T:N", show_default=False,
        help="Resize the job to N pserver shards T seconds in, while it trains (repeatable: "
             "--resize 60:3 --resize 120:2).")] = None,
) -> None:
    """Run the demo job: services up, a synthetic click stream, master, 2 pservers and 2 trainers
    under a supervisor, a live view of lag, AUC and freshness; a summary at the end."""
    from streamtrain.console.demo import parse_resize, run_demo

    try:
        resizes = [parse_resize(r) for r in resize or ()]
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--resize") from exc
    try:
        summary = run_demo(_services(home, port_base), console, duration=duration, headless=headless,
                           keep_running=keep, resizes=resizes)
    except InfraError as exc:
        err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(1) from exc
    if summary.stray:
        raise typer.Exit(1)


job_app = typer.Typer(help="Inspect and run jobs.", no_args_is_help=True)
app.add_typer(job_app, name="job")

JobOpt = Annotated[str, typer.Option("--job", help="Job file (TOML), or the name of a running job.")]
MetricsPortOpt = Annotated[Optional[int], typer.Option(
    "--metrics-port", envvar="STREAMTRAIN_METRICS_PORT", show_default=False,
    help="Port of the Prometheus /metrics endpoint (default 0: a free port, logged at start-up).")]


def _serve_metrics(port: int | None, process: str, ready: Callable[[], bool] = lambda: True) -> None:
    from streamtrain.infra.metrics import serve_metrics

    bound = serve_metrics(port or 0, ready=ready)
    logging.getLogger(f"streamtrain.{process}").info(
        "metrics at http://0.0.0.0:%d/metrics, probes at /healthz and /readyz", bound)


def _setup_logging(verbose: bool = False) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s [%(process)d] %(message)s",
    )


def _job_name(job: str) -> str:
    path = Path(job)
    if path.suffix == ".toml" or path.exists():
        return _load_config(path).name
    return job


def _load_config(path: Path) -> JobConfig:
    from streamtrain.schemas.config import JobConfig, JobConfigError

    try:
        return JobConfig.load(path)
    except JobConfigError as exc:
        err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from exc


@app.command("master")
def master_cmd(
    job: Annotated[Path, typer.Option("--job", help="Job file (TOML).")],
    identity: Annotated[Optional[str], typer.Option(help="Name in the lock (default host:pid).")] = None,
    metrics_port: MetricsPortOpt = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
) -> None:
    """Run the job's master: waits as standby until it holds the lock, then slices and
    dispatches. Exits 3 when it loses the lock (a supervisor restarts it as a standby)."""
    from streamtrain.jobstate.errors import CoordinationError, LayoutChangedError, NotLeaderError
    from streamtrain.jobstate.etcd import Etcd
    from streamtrain.jobstate.offsets import InputOffsets
    from streamtrain.master.service import Master

    _setup_logging(verbose)
    config = _load_config(job)
    endpoints = Endpoints.resolve()
    stop = stop_on_signals()
    _serve_metrics(metrics_port, "master")
    etcd = Etcd.connect(endpoints)
    try:
        Master(etcd, InputOffsets(endpoints), config, identity).run(stop)
    except NotLeaderError as exc:
        logging.getLogger("streamtrain.master").error("%s", exc)
        raise typer.Exit(3) from exc
    except LayoutChangedError as exc:  # the job file's fault: as a bad job file's
        logging.getLogger("streamtrain.master").error("%s", exc)
        raise typer.Exit(2) from exc
    except CoordinationError as exc:
        logging.getLogger("streamtrain.master").error("%s", exc)
        raise typer.Exit(1) from exc
    finally:
        etcd.close()


@app.command("pserver")
def pserver_cmd(
    job: JobOpt,
    index: Annotated[Optional[int], typer.Option(
        "--index", help="Shard index to take (default: the first free one).", show_default=False)] = None,
    checkpoint_every_s: Annotated[Optional[float], typer.Option(
        "--checkpoint-every-s", help="Override the job's pservers.checkpoint_every_s.",
        show_default=False)] = None,
    lease_ttl_s: Annotated[int, typer.Option(
        "--lease-ttl-s", help="TTL of the shard's membership lease: a killed shard's index is "
        "free again after this.")] = 10,
    metrics_port: MetricsPortOpt = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
) -> None:
    """Run one parameter-server shard: recover from its newest checkpoint, replay its gradient
    topic, then apply and serve. Exits 3 if it loses its lease (a supervisor restarts it)."""
    from streamtrain.jobstate.errors import CoordinationError
    from streamtrain.params.optimizers import UpdateRuleError
    from streamtrain.pserver.checkpoint_store import CheckpointError
    from streamtrain.pserver.shard import PserverShard, ShardLostError, ShardOptions

    _setup_logging(verbose)
    stop = stop_on_signals()
    shard = PserverShard(Endpoints.resolve(), ShardOptions(
        _job_name(job), index, lease_ttl_s=lease_ttl_s, checkpoint_every_s=checkpoint_every_s))
    _serve_metrics(metrics_port, "pserver", ready=lambda: shard.serving)
    log = logging.getLogger("streamtrain.pserver")
    try:
        shard.run(stop)
    except ShardLostError as exc:
        log.error("%s", exc)
        raise typer.Exit(3) from exc
    except (CoordinationError, CheckpointError, UpdateRuleError) as exc:
        log.error("%s", exc)
        raise typer.Exit(1) from exc


@app.command("trainer")
def trainer_cmd(
    job: JobOpt,
    trainer_id: Annotated[Optional[str], typer.Option(
        "--id", help="Trainer id: its membership key and, under exactly-once, the suffix of its side "
        "outputs' Kafka transactional.id (default host-pid). A restarted trainer with the same id fences "
        "its predecessor's open transaction.",
        show_default=False)] = None,
    max_tasks: Annotated[Optional[int], typer.Option("--max-tasks", help="Stop after this many tasks.",
                                                     show_default=False)] = None,
    lease_ttl_s: Annotated[int, typer.Option("--lease-ttl-s", help="TTL of the membership lease.")] = 10,
    cpus: Annotated[Optional[str], typer.Option(
        "--cpus", help="Run this trainer and its loaders on these CPUs only, e.g. 0 or 0,2-3 (Linux). "
        "`job run` gives each of its trainers a share of the machine's CPUs.", show_default=False)] = None,
    metrics_port: MetricsPortOpt = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
) -> None:
    """Run a trainer: claim tasks, read exactly their offsets, train, push gradients, until
    stopped. SIGTERM releases the current task cleanly."""
    from rich.markup import escape

    from streamtrain.infra import cpus as cpu_affinity
    from streamtrain.jobstate.errors import CoordinationError
    from streamtrain.trainer.worker import Trainer

    _setup_logging(verbose)
    if cpus is not None:
        try:
            cpu_affinity.pin(cpu_affinity.parse(cpus))
        except (ValueError, InfraError) as exc:
            err.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False)
            raise typer.Exit(2) from exc
    stop = stop_on_signals()
    trainer = Trainer(Endpoints.resolve(), _job_name(job), trainer_id, lease_ttl_s=lease_ttl_s)
    _serve_metrics(metrics_port, "trainer", ready=lambda: trainer.registered)
    try:
        trainer.run(stop, max_tasks)
    except CoordinationError as exc:
        logging.getLogger("streamtrain.trainer").error("%s", exc)
        raise typer.Exit(1) from exc


@app.command("curves")
def curves_cmd(
    job: JobOpt,
    logdir: Annotated[Path, typer.Option("--logdir", help="TensorBoard log directory to write into.")],
    from_beginning: Annotated[bool, typer.Option(
        "--from-beginning", help="Read <job>.metrics from its first record, not from now.")] = False,
    until_end: Annotated[bool, typer.Option(
        "--until-end", help="Stop at the end the topic had at start (with --from-beginning).")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
) -> None:
    """Write a job's training curves for TensorBoard (loss, AUC, examples/s, bad records,
    freshness; step = cumulative examples) from <job>.metrics, until stopped."""
    from streamtrain.operations.curves import write_curves

    _setup_logging(verbose)
    try:
        write_curves(Endpoints.resolve(), _job_name(job), logdir, stop_on_signals(), from_beginning, until_end)
    except RuntimeError as exc:
        err.print(f"error: {exc}", markup=False, highlight=False)
        raise typer.Exit(1) from exc


@job_app.command("status")
def job_status_cmd(
    job: JobOpt,
    as_json: Annotated[bool, typer.Option("--json", help="Print the status as JSON.")] = False,
) -> None:
    """Queue sizes, cursors against end offsets (lag), members, failed tasks with reasons."""
    from streamtrain.jobstate.etcd import Etcd
    from streamtrain.jobstate.offsets import InputOffsets
    from streamtrain.jobstate.status import job_status

    endpoints = Endpoints.resolve()
    etcd = Etcd.connect(endpoints)
    try:
        status = job_status(etcd, InputOffsets(endpoints), _job_name(job))
    finally:
        etcd.close()
    if as_json:
        print(json.dumps(status.as_dict(), indent=2))
        return
    leader = status.leader.name if status.leader else "[red]none[/red]"
    console.print(f"job [bold]{status.job}[/bold]  state {status.state}  leader {leader}")
    console.print("tasks  " + "  ".join(f"{k} {v}" for k, v in status.queues.items()))
    table = Table("partition", "pass", "sliced to", "trained to", "end", "lag")
    for p in status.partitions:
        table.add_row(f"{p.topic}:{p.partition}", str(p.pass_no), str(p.sliced_to),
                      str(p.trained_to), "?" if p.end is None else str(p.end),
                      "?" if p.lag is None else str(p.lag))
    console.print(table)
    console.print(f"trainers {len(status.members.trainers)}: {', '.join(sorted(status.members.trainers)) or '-'}")
    console.print(f"pservers {len(status.members.pservers)}: "
                  f"{', '.join(str(i) for i in sorted(status.members.pservers)) or '-'}")
    if status.slots:
        console.print(f"slots    {sum(status.slots.values())} over {len(status.slots)} shards "
                      f"(epoch {status.epoch}): "
                      + "  ".join(f"{shard}:{n}" for shard, n in status.slots.items()))
    if status.resizing:
        console.print(f"[yellow]resizing[/yellow] to {status.resizing.shards} shards: rolling back to "
                      f"{status.resizing.checkpoint} (`streamtrain resize` again finishes it)")
    for task in status.failed:
        console.print(f"[red]failed[/red] {task.task_id} [{task.start}, {task.end}): {task.reason}")


@app.command("predict")
def predict_cmd(
    job: JobOpt,
    source: Annotated[str, typer.Argument(metavar="[FILE|-]",
        help="File of records, one per line in the job's input.format (base64 lines for binary, avro and protobuf); "
        "'-' or nothing reads stdin.", show_default=False)] = "-",
    as_json: Annotated[bool, typer.Option(
        "--json/--text", help="One JSON object per record (default), or 'LINE<TAB>SCORE' / "
        "'LINE<TAB>error: REASON'.")] = True,
    batch_size: Annotated[int, typer.Option(
        "--batch-size", min=1, help="Records per scoring call (parameters are pulled fresh for each; "
        "1 when reading a terminal).")] = 256,
) -> None:
    """Score records with the newest parameters of a running job: one result per record,
    {"line": n, "score": p} or {"line": n, "error": reason} (the command goes on)."""
    import sys

    from streamtrain.operations.predict import PredictError, Predictor

    try:
        predictor, client = Predictor.connect(Endpoints.resolve(), _job_name(job))
    except PredictError as exc:
        err.print(f"error: {exc}", markup=False, highlight=False)
        raise typer.Exit(1) from exc
    try:
        stream = sys.stdin.buffer if source == "-" else open(source, "rb")  # noqa: SIM115
    except OSError as exc:
        err.print(f"error: {source}: {exc.strerror}", markup=False, highlight=False)
        raise typer.Exit(2) from exc
    if source == "-" and sys.stdin.isatty():
        batch_size = 1
    try:
        for result in predictor.predict(stream, batch_size):
            if as_json:
                line = json.dumps(result.as_dict())
            else:
                line = (f"{result.line}\t{result.score:.6f}" if result.error is None
                        else f"{result.line}\terror: {result.error}")
            sys.stdout.write(line + "\n")
            if batch_size == 1:
                sys.stdout.flush()
    except PredictError as exc:
        sys.stdout.flush()
        err.print(f"error: {exc}", markup=False, highlight=False)
        raise typer.Exit(1) from exc
    except BrokenPipeError:  # `streamtrain predict ... | head`
        pass
    finally:
        if stream is not sys.stdin.buffer:
            stream.close()
        client.close()


@app.command("checkpoint")
def checkpoint_cmd(
    job: JobOpt,
    wait_s: Annotated[float, typer.Option(
        "--wait-s", help="How long every pserver shard has to register the checkpoint.")] = 60.0,
    as_json: Annotated[bool, typer.Option("--json", help="Print id, shards, time as JSON.")] = False,
) -> None:
    """Checkpoint every pserver shard of a running job now; once all have registered it, record
    it as checkpoints/latest and print its id. Exits 1 naming the shards that did not answer."""
    from streamtrain.jobstate.etcd import Etcd
    from streamtrain.operations.checkpoints import CheckpointError, request_checkpoint

    etcd = Etcd.connect(Endpoints.resolve())
    try:
        done = request_checkpoint(etcd, _job_name(job), wait_s)
    except CheckpointError as exc:
        err.print(f"error: {exc}", markup=False, highlight=False)
        raise typer.Exit(1) from exc
    finally:
        etcd.close()
    print(json.dumps(done.as_dict()) if as_json else done.id)


@app.command("rollback")
def rollback_cmd(
    job: JobOpt,
    to: Annotated[str, typer.Option("--to", help="Checkpoint id (from `streamtrain checkpoint`), or 'latest'.")],
    wait_s: Annotated[float, typer.Option("--wait-s", help="How long the master and shards have.")] = 120.0,
    paused: Annotated[bool, typer.Option("--stay-paused", help="Leave trainers paused afterwards.")] = False,
) -> None:
    """Return the whole job to a checkpoint: shards load it and skip the gradients since, the
    master requeues the tasks trained since, trainers train them again."""
    from streamtrain.jobstate.etcd import Etcd
    from streamtrain.operations.checkpoints import CheckpointError, rollback
    from streamtrain.schemas import EtcdKeys, LatestCheckpoint

    name = _job_name(job)
    etcd = Etcd.connect(Endpoints.resolve())
    try:
        if to == "latest":
            latest = etcd.get(EtcdKeys(name).checkpoints_latest)
            if latest is None:
                raise CheckpointError(f"job {name!r} has no checkpoints/latest")
            to = LatestCheckpoint.from_json(latest.value).id
        rollback(etcd, name, to, wait_s, resume=not paused)
    except CheckpointError as exc:
        err.print(f"error: {exc}", markup=False, highlight=False)
        raise typer.Exit(1) from exc
    finally:
        etcd.close()
    print(to)


@app.command("resize")
def resize_cmd(
    job: JobOpt,
    pservers: Annotated[int, typer.Option("--pservers", min=1, help="The job's shard count from now on.")],
    wait_s: Annotated[float, typer.Option("--wait-s", help="How long the checkpoint and the rollback have.")] = 300.0,
) -> None:
    """Move a running job to N parameter-server shards: checkpoint, move the fewest slots with
    their rows and optimizer state, roll back to the moved copy; trainers pause meanwhile. A
    shard that joins must be started (`pserver --job JOB --index i`); one that leaves stops."""
    from streamtrain.jobstate.etcd import Etcd
    from streamtrain.operations.checkpoints import CheckpointError
    from streamtrain.operations.resizing import ResizeError, resize
    from streamtrain.pserver.storage import ShardStorage

    name = _job_name(job)
    endpoints = Endpoints.resolve()
    etcd = Etcd.connect(endpoints)
    try:
        done = resize(etcd, ShardStorage(endpoints), name, pservers, wait_s)
    except (CheckpointError, ResizeError) as exc:
        err.print(f"error: {exc}", markup=False, highlight=False)
        raise typer.Exit(1) from exc
    finally:
        etcd.close()
    if done.checkpoint is None:
        console.print(f"job {name} has {done.shards} shards already; nothing moved", highlight=False)
        return
    console.print(f"job {name}: {done.shards_before} -> {done.shards} shards, {done.moved_slots} slots moved, "
                  f"rolled back to {done.checkpoint} in {done.took_s:.1f} s", highlight=False)


@job_app.command("check")
def job_check_cmd(
    job: Annotated[Path, typer.Option("--job", help="Job file (TOML).")],
    sample: Annotated[int, typer.Option("--sample", min=1, help="Records to read: the newest of each input "
                                        "topic, shared out over its partitions.")] = 1000,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
) -> None:
    """Decode a sample of the job's input as its trainers would and show what comes out, so a
    job file can be fixed before training: fields found, ids per record, label rate, bad
    records with their reasons."""
    from streamtrain.jobstate.offsets import InputOffsets, InputUnavailableError
    from streamtrain.trainer.check import check_records, sample_ranges
    from streamtrain.trainer.reader import RangeReader

    config = _load_config(job)
    endpoints = Endpoints.resolve()
    offsets, records = InputOffsets(endpoints), []
    reader = RangeReader(endpoints, f"{config.name}.check", stall_s=10.0)
    try:
        for topic in config.input.topics:
            ranges = sample_ranges(offsets.bounds(offsets.partitions([topic])), sample)
            for (t, p), (start, end) in ranges.items():
                records += [(f"{t}:{p}@{m.offset()}", m.value()) for m in reader.read(t, p, start, end)]
    except InputUnavailableError as exc:
        err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(1) from exc
    finally:
        reader.close()
    report = check_records(config, records)
    if as_json:
        print(json.dumps(report.as_dict(), indent=2))
        return
    share = f"{report.good / report.records:.1%}" if report.records else "-"
    console.print(f"records {report.records}  good {report.good} ({share})  bad {len(report.bad)}")
    if report.label_rate is not None and report.event_time_ms is not None:  # both set, or neither
        console.print(f"label rate {report.label_rate:.4f}  event time {report.event_time_ms[0]} .. "
                      f"{report.event_time_ms[1]} ms")
    table = Table("sparse field", "model reads it", "present", "ids a record", "distinct ids")
    for f in report.fields:
        present = "-" if f.present != f.present else f"{f.present:.1%}"
        ids = "-" if f.ids_per_record != f.ids_per_record else f"{f.ids_per_record:.2f}"
        table.add_row(f.name, "yes" if f.used else "[yellow]no[/yellow]", present, ids,
                      str(f.distinct_ids) if f.used else "-")
    console.print(table)
    console.print(f"dense features {report.dense_features}: mean "
                  + (", ".join(f"{x:.4g}" for x in report.dense_mean) or "-"))
    for where, reason in report.bad[:10]:
        console.print(f"[red]bad[/red] {where}: {reason}")
    if len(report.bad) > 10:
        console.print(f"... and {len(report.bad) - 10} more bad records")


@job_app.command("run")
def job_run_cmd(
    job: Annotated[Path, typer.Option("--job", help="Job file (TOML).")],
    trainers: Annotated[int, typer.Option("--trainers", min=0, help="Trainer processes.")] = 2,
    log_dir: Annotated[Optional[Path], typer.Option(
        "--log-dir", help="Where each process logs (default: <state dir>/jobs/<job>/logs).",
        show_default=False)] = None,
) -> None:
    """Run a whole job locally: its master, pservers.count shards and N trainers as child
    processes under a restarting supervisor, with a status line every few seconds, until
    Ctrl-C/SIGTERM. The services and input topics must already exist (`streamtrain up`)."""
    from streamtrain.console.jobrun import run_job
    from streamtrain.jobstate.errors import LayoutChangedError
    from streamtrain.local import LocalJob

    config = _load_config(job)
    try:
        summary = run_job(LocalJob(config, trainers=trainers, log_dir=log_dir, job_file=job.resolve()), console)
    except InfraError as exc:
        err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(1) from exc
    except LayoutChangedError as exc:
        err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from exc
    if summary.stray:
        raise typer.Exit(1)


from streamtrain.producers.cli import join_cmd, produce_app  # noqa: E402  (registered last: optional heavy imports stay lazy)

app.add_typer(produce_app, name="produce")
app.command("join")(join_cmd)


def main() -> None:
    app()
