"""A schema registry that speaks Confluent's REST API, for topics of Avro or Protobuf records.

Apicurio Registry 2.6 (Apache-2.0) serves Confluent's API under `/apis/ccompat/v7` and keeps
its schemas in an in-memory H2 database. Confluent's own registry is not on Maven Central and
Karapace is not on PyPI; Apicurio's release is, as a runnable Quarkus application
(`apicurio-registry-app-<version>-all.tar.gz`), which Maven unpacks into the cache once. 2.6
runs on Java 11 and later (3.x needs 21). It is optional: `streamtrain up --registry` and the
tests that need one start it; a production job names its own registry (`input.registry`).
Schemas live as long as the process: a restarted local registry is empty.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from streamtrain.infra.errors import InfraError, ServiceStartError
from streamtrain.infra.kafka_broker import _INSTALL_JAVA, _INSTALL_MAVEN, cache_root
from streamtrain.infra.process import OnePortServer, require

APICURIO = "io.apicurio:apicurio-registry-app:2.6.13.Final:tar.gz:all"
RUNNER = "apicurio-registry-app-2.6.13.Final-runner.jar"
CONFLUENT_API = "/apis/ccompat/v7"
DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1"
# As the broker's: a small heap, C1 only, no concurrent collector threads on a 2-core machine.
JVM_OPTS = ["-Xms64m", "-Xmx256m", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC"]


def registry_dir() -> Path:
    return cache_root() / "schema-registry" / APICURIO.split(":")[2]


def ensure_registry_dist() -> Path:
    """Unpack the registry's release from Maven Central once; later calls are free."""
    home = registry_dir()
    if (home / ".complete").exists():
        return home
    mvn = require("mvn", _INSTALL_MAVEN)
    staging = home.with_name(f"{home.name}.partial-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    result = subprocess.run(
        [mvn, "-q", "-B", f"{DEPENDENCY_PLUGIN}:unpack", f"-Dartifact={APICURIO}", f"-DoutputDirectory={staging}"],
        capture_output=True, text=True, check=False, cwd=staging,
    )
    if result.returncode != 0 or not (staging / RUNNER).exists():
        raise ServiceStartError(
            f"Maven could not unpack the schema registry {APICURIO} (exit {result.returncode}):\n"
            f"{result.stdout[-3000:]}{result.stderr[-3000:]}"
        )
    (staging / ".complete").write_text("ok\n")
    try:
        staging.rename(home)  # atomic: a concurrent installer sees a complete dir or none
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
    return home


class SchemaRegistryServer(OnePortServer):
    name = "registry"

    @property
    def address(self) -> str:
        return f"http://127.0.0.1:{self.port}{CONFLUENT_API}"

    def command(self) -> list[str]:
        java = require("java", _INSTALL_JAVA)
        return [java, *JVM_OPTS, f"-Dquarkus.http.port={self.port}", "-Dquarkus.http.host=127.0.0.1",
                "-jar", str(ensure_registry_dist() / RUNNER)]

    def healthy(self) -> bool:
        return subjects_ok(self.address)


def subjects_ok(url: str, timeout: float = 3.0) -> bool:
    """The registry lists its subjects: the readiness test for any Confluent-API registry."""
    try:
        with urllib.request.urlopen(f"{url.rstrip('/')}/subjects", timeout=timeout) as reply:
            return isinstance(json.loads(reply.read()), list)
    except (OSError, ValueError, urllib.error.URLError):
        return False


class RegistryUnavailableError(InfraError):
    """The registry did not answer (or answered with a server error): nothing is known about
    the schema, so the records wait for it rather than being judged bad."""


@dataclass(frozen=True)
class RegisteredSchema:
    id: int
    text: str
    type: str  # AVRO, PROTOBUF or JSON, as the registry names it


def fetch_schema(url: str, schema_id: int, timeout: float = 5.0, attempts: int = 3) -> RegisteredSchema | None:
    """The schema registered under `schema_id`, or None if the registry has no such id.

    Raises:
        RegistryUnavailableError: no answer after `attempts` tries a second apart.
    """
    address = f"{url.rstrip('/')}/schemas/ids/{schema_id}"
    for attempt in range(attempts):
        try:
            with urllib.request.urlopen(address, timeout=timeout) as reply:
                body = json.loads(reply.read())
            return RegisteredSchema(schema_id, body["schema"], body.get("schemaType", "AVRO"))
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            problem = f"HTTP {exc.code}"
        except (OSError, urllib.error.URLError) as exc:
            problem = str(exc)
        except (ValueError, KeyError, TypeError) as exc:
            problem = f"an answer that is not a schema ({exc!r})"
        if attempt + 1 < attempts:
            time.sleep(1.0)
    raise RegistryUnavailableError(f"schema registry {url}: schema id {schema_id}: {problem}")
