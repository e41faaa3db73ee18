"""Apache Kafka 4.x in KRaft mode, combined broker+controller nodes, jars from Maven Central.

One node, or several started as one cluster: each is a voter of the controller quorum (static
voters, so nothing needs bootstrapping and a restart finds the quorum as it was), and the
internal topics (consumer offsets, transaction state) are replicated like the job's own
(`infra.clients.replication`), so one node killed loses no transaction state.

Maven resolves `org.apache.kafka:kafka_2.13` (see pom.xml beside this file) into a cache dir
keyed by the pom's hash, so bumping the version in the pom is all an upgrade takes and nothing
is ever committed. Storage is formatted once per data dir; after a crash the broker recovers
its logs from that dir, topics and messages intact.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import os
import shutil
import socket
import subprocess
import uuid
from importlib.resources import files
from pathlib import Path
from typing import Any

from streamtrain.infra.clients import replication
from streamtrain.infra.errors import ServiceStartError
from streamtrain.infra.process import ServerProcess, require

BROKER_MAIN = "kafka.Kafka"
STORAGE_TOOL = "kafka.tools.StorageTool"
# A test-sized heap; the broker runs comfortably in it on this 2-core machine.
# A local broker shares a small machine with the whole job: C1 compiles its hot paths at a
# fraction of C2's CPU, and the serial collector has no concurrent threads (docs/services.md).
JVM_OPTS = ["-Xms256m", "-Xmx512m", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC"]
_INSTALL_JAVA = "apt-get install -y openjdk-17-jre-headless"
_INSTALL_MAVEN = "apt-get install -y maven"


def cache_root() -> Path:
    if explicit := os.environ.get("STREAMTRAIN_CACHE"):
        return Path(explicit).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "streamtrain"


def _pom_text() -> bytes:
    return files(__package__).joinpath("pom.xml").read_bytes()


def kafka_lib_dir() -> Path:
    digest = hashlib.sha256(_pom_text()).hexdigest()[:12]
    return cache_root() / "kafka" / digest / "lib"


def ensure_kafka_jars() -> Path:
    """Resolve the broker's runtime classpath with Maven once; later calls are free."""
    lib = kafka_lib_dir()
    if (lib / ".complete").exists():
        return lib
    mvn = require("mvn", _INSTALL_MAVEN)
    require("java", _INSTALL_JAVA)
    staging = lib.with_name(f"lib.partial-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    pom = staging.parent / "pom.xml"
    pom.write_bytes(_pom_text())
    result = subprocess.run(
        [mvn, "-q", "-B", "-f", str(pom), "dependency:copy-dependencies",
         "-DincludeScope=runtime", f"-DoutputDirectory={staging}"],
        capture_output=True, text=True, check=False,
    )
    if result.returncode != 0:
        raise ServiceStartError(
            f"Maven could not resolve the Kafka jars (exit {result.returncode}):\n"
            f"{result.stdout[-3000:]}{result.stderr[-3000:]}"
        )
    (staging / ".complete").write_text("ok\n")
    # rename is atomic: a concurrent resolver either sees a complete dir or none.
    try:
        staging.rename(lib)
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
    return lib


_LOG4J = """\
status = warn
appender.file.type = File
appender.file.name = FILE
appender.file.fileName = {log}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = FILE
logger.kafka.name = kafka
logger.kafka.level = WARN
logger.apache.name = org.apache.kafka
logger.apache.level = WARN
logger.started.name = kafka.server.KafkaRaftServer
logger.started.level = INFO
"""


class KafkaBroker(ServerProcess):
    """One node. `node_id` and `voters` (every node's id → controller port, this one's
    included): its place in a cluster; by default a cluster of one. `cluster_id_file`: where
    the nodes of one cluster find the id they all format their storage with (one node: in
    its own data dir)."""

    name = "kafka"

    def __init__(self, data_dir: Path, port: int, controller_port: int, node_id: int = 1,
                 voters: dict[int, int] | None = None, cluster_id_file: Path | None = None) -> None:
        super().__init__(data_dir)
        self.port = port
        self.controller_port = controller_port
        self.node_id = node_id
        self.voters = voters or {node_id: controller_port}
        self.cluster_id_file = cluster_id_file or data_dir / "cluster.id"
        self.properties = data_dir / "server.properties"
        self.log4j = data_dir / "log4j2.properties"
        self.log_dir = data_dir / "logs"

    @property
    def ports(self) -> tuple[int, ...]:
        return (self.port, self.controller_port)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _java(self) -> list[str]:
        java = require("java", _INSTALL_JAVA)
        return [java, "-cp", f"{ensure_kafka_jars()}/*",
                f"-Dlog4j2.configurationFile={self.log4j}"]

    def prepare(self) -> None:
        # Ports may differ from the last run, so the config is rewritten each start;
        # storage is formatted only once (the meta.properties file marks it).
        self.properties.write_text(self._server_properties())
        self.log4j.write_text(_LOG4J.format(log=self.data_dir / "server.log"))
        if (self.log_dir / "meta.properties").exists():
            return
        result = subprocess.run(
            [*self._java(), STORAGE_TOOL, "format", "-t", shared_cluster_id(self.cluster_id_file),
             "-c", str(self.properties)],
            capture_output=True, text=True, check=False,
        )
        if result.returncode != 0:
            raise ServiceStartError(f"formatting Kafka storage failed:\n{result.stdout}{result.stderr}")

    def _server_properties(self) -> str:
        factor, min_insync = replication(len(self.voters), 0, 0)
        settings = {
            "process.roles": "broker,controller",
            "node.id": str(self.node_id),
            # A static voter set needs no --standalone bootstrap and survives restarts as is.
            "controller.quorum.voters": ",".join(f"{n}@127.0.0.1:{p}" for n, p in sorted(self.voters.items())),
            "listeners": f"PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "inter.broker.listener.name": "PLAINTEXT",
            "log.dirs": str(self.log_dir),
            "num.partitions": "1",
            # The internal topics as replicated as the job's (one node: one replica).
            "offsets.topic.replication.factor": str(factor),
            "transaction.state.log.replication.factor": str(factor),
            "transaction.state.log.min.isr": str(min_insync),
            "share.coordinator.state.topic.replication.factor": str(factor),
            "share.coordinator.state.topic.min.isr": str(min_insync),
            # Fewer internal partitions make the first group/transaction on a fresh broker fast.
            "offsets.topic.num.partitions": "4",
            "transaction.state.log.num.partitions": "4",
            "group.initial.rebalance.delay.ms": "0",
            # A trainer killed inside a commit leaves an open transaction that holds back every
            # read_committed reader until the broker aborts it: look for expired ones every
            # second, not every 10 s (the client's transaction.timeout.ms still decides when).
            "transaction.abort.timed.out.transaction.cleanup.interval.ms": "1000",
            # A compacted topic (the DLQ) shows its compacted state within a second of a segment
            # closing, not after the cleaner's default 15 s nap; a check finds nothing to clean
            # on an idle broker and costs next to nothing.
            "log.cleaner.backoff.ms": "1000",
            # After a SIGKILL the restarted controller refuses the broker's new registration
            # until the dead incarnation's session ends: at the default 9 s that wait is most
            # of Kafka's restart. Heartbeats every half second keep a live broker registered.
            "broker.heartbeat.interval.ms": "500",
            "broker.session.timeout.ms": "3000",
            # Topics are created on purpose, with the partition count the job asks for.
            "auto.create.topics.enable": "false",
        }
        return "".join(f"{k}={v}\n" for k, v in settings.items())

    def command(self) -> list[str]:
        java, *classpath = self._java()
        return [java, *JVM_OPTS, *classpath, BROKER_MAIN, str(self.properties)]

    def healthy(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                pass
        except OSError:
            return False
        return metadata_ok(self.address, self.node_id)


def new_cluster_id() -> str:
    """Kafka's own form: a random UUID in URL-safe base64 without padding, drawn again while
    it starts with "-" (as Kafka's `Uuid.randomUuid` does), which a command line would take
    for an option."""
    while True:
        found = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not found.startswith("-"):
            return found


def shared_cluster_id(path: Path) -> str:
    """The cluster id in `path`, written there first if no node has yet: the nodes of a
    cluster are prepared at once, and the first to link its id in place wins."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        new = new_cluster_id()
        staged = path.with_name(f"{path.name}.{os.getpid()}.{uuid.uuid4().hex}")
        staged.write_text(new + "\n")
        try:
            os.link(staged, path)  # atomic, and refused if another node's id is there
        except FileExistsError:
            pass
        finally:
            staged.unlink()
    return path.read_text().strip()


_quiet = logging.getLogger("streamtrain.infra.kafka-probe")
_quiet.addHandler(logging.NullHandler())
_quiet.propagate = False


def metadata_ok(bootstrap: str, node_id: int | None = None, timeout: float = 3.0) -> bool:
    """A metadata request answered by a broker: the readiness test for any Kafka cluster;
    with `node_id`, one that lists that node (a node of a local cluster is ready once the
    cluster has admitted it, not when another node answers)."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    # Any: the stubs type config values str | int | float, but "logger" takes a logging.Logger.
    config: dict[str, Any] = {"bootstrap.servers": bootstrap, "logger": _quiet}
    admin = AdminClient(config)
    try:
        md = admin.list_topics(timeout=timeout)
    except KafkaException:
        return False
    return node_id in md.brokers if node_id is not None else bool(md.brokers)
