"""The Kubernetes base (deploy/k8s/base) and the image (deploy/docker/Dockerfile), checked
without a cluster: every resource valid against a named Kubernetes release's schemas (strict:
an unknown field is an error), the resources agreeing with each other, the commands they run
accepted by the CLI, the job file valid, and the image copying every package."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from typer.testing import CliRunner

from streamtrain.cli import app
from streamtrain.schemas.config import JobConfig

ROOT = Path(__file__).resolve().parents[2]
BASE = ROOT / "deploy" / "k8s" / "base"
KUBERNETES = "1.31.0"
WORKLOADS = ("Deployment", "StatefulSet")


def render() -> list[dict]:
    """What `kustomize build` makes of the base: its resources, in order. The base uses nothing
    else of kustomize, and this test fails if it starts to (then render with kustomize)."""
    kustomization = yaml.safe_load((BASE / "kustomization.yaml").read_text())
    assert set(kustomization) == {"apiVersion", "kind", "resources"}, kustomization
    return [doc for name in kustomization["resources"] for doc in yaml.safe_load_all((BASE / name).read_text()) if doc]


RESOURCES = render()


def of_kind(kind: str) -> list[dict]:
    return [r for r in RESOURCES if r["kind"] == kind]


def pod_labels() -> list[dict]:
    return [r["spec"]["template"]["metadata"]["labels"] for r in RESOURCES if r["kind"] in WORKLOADS]


def containers() -> list[dict]:
    return [c for r in RESOURCES if r["kind"] in WORKLOADS for c in r["spec"]["template"]["spec"]["containers"]]


def selects(selector: dict, labels: dict) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


@pytest.mark.parametrize("resource", RESOURCES, ids=lambda r: f"{r['kind']}/{r['metadata']['name']}")
def test_every_resource_is_valid_against_the_named_release(resource) -> None:
    kubernetes_validate.validate(resource, KUBERNETES, strict=True)


def test_every_selector_selects_pods_of_the_base() -> None:
    for workload in (r for r in RESOURCES if r["kind"] in WORKLOADS):
        spec = workload["spec"]
        assert selects(spec["selector"]["matchLabels"], spec["template"]["metadata"]["labels"]), workload["metadata"]
    for resource in of_kind("PodDisruptionBudget") + of_kind("Service"):
        selector = resource["spec"]["selector"]
        selector = selector.get("matchLabels", selector)
        assert any(selects(selector, labels) for labels in pod_labels()), resource["metadata"]


def test_references_name_resources_of_the_base() -> None:
    names = {(r["kind"], r["metadata"]["name"]) for r in RESOURCES}
    for statefulset in of_kind("StatefulSet"):
        service = next(s for s in of_kind("Service") if s["metadata"]["name"] == statefulset["spec"]["serviceName"])
        assert service["spec"]["clusterIP"] == "None"  # headless: the pods' stable names
    for hpa in of_kind("HorizontalPodAutoscaler"):
        target = hpa["spec"]["scaleTargetRef"]
        assert (target["kind"], target["name"]) in names
    for workload in (r for r in RESOURCES if r["kind"] in WORKLOADS):
        pod = workload["spec"]["template"]["spec"]
        for volume in pod.get("volumes", []):
            assert ("ConfigMap", volume["configMap"]["name"]) in names
        for container in pod["containers"]:
            for source in container.get("envFrom", []):
                assert ("ConfigMap", source["configMapRef"]["name"]) in names
            ports = {p["name"] for p in container["ports"]}
            for probe in ("livenessProbe", "readinessProbe"):
                assert container[probe]["httpGet"]["port"] in ports
                assert container[probe]["httpGet"]["path"] in ("/healthz", "/readyz")
            assert {m["name"] for m in container["volumeMounts"]} <= {v["name"] for v in pod["volumes"]}


def test_the_containers_run_commands_the_cli_takes() -> None:
    for container in containers():
        defined = {e["name"] for e in container.get("env", [])}
        used = {m for arg in container["args"] for m in re.findall(r"\$\((\w+)\)", arg)}
        assert used <= defined, (container["name"], used - defined)
        args = [re.sub(r"\$\((\w+)\)", "0", arg) for arg in container["args"]]
        # Parsed, then --help: an unknown command or option fails the parse (exit 2).
        result = CliRunner().invoke(app, [*args, "--help"])
        assert result.exit_code == 0, (args, result.output)


def test_the_job_file_is_valid_and_matches_the_shards() -> None:
    (job,) = [c for c in of_kind("ConfigMap") if "job.toml" in c["data"]]
    config = JobConfig.from_toml(job["data"]["job.toml"])
    (shards,) = of_kind("StatefulSet")
    assert shards["spec"]["replicas"] == config.pservers.count
    hpa = of_kind("HorizontalPodAutoscaler")[0]["spec"]["metrics"][0]["external"]["metric"]
    assert hpa["selector"]["matchLabels"]["job"] == config.name


def test_the_image_copies_every_package_the_project_installs() -> None:
    dockerfile = (ROOT / "deploy" / "docker" / "Dockerfile").read_text()
    copied = [line.split()[1:-1] for line in dockerfile.splitlines() if line.startswith("COPY ")]
    sources = {source for sources in copied for source in sources}
    assert all((ROOT / source).exists() for source in sources), sources
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert set(project["tool"]["setuptools"]["package-dir"].values()) | {"pyproject.toml", "README.md"} == sources
