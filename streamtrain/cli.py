"""`streamtrain`: flags and environment are read here and nowhere else."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from infra import InfraError, LocalServices, Ports
from infra.endpoints import state_home

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


def _services(home: Path | None, port_base: int | None = None) -> LocalServices:
    ports = Ports.from_base(port_base) if port_base is not None else None
    return LocalServices(home or state_home(), ports)


@app.command()
def up(
    home: HomeOpt = None,
    port_base: Annotated[Optional[int], typer.Option(
        "--port-base", help="Kafka on BASE, its controller BASE+1, etcd BASE+2 (peer BASE+3), "
        "Redis BASE+4 [env: STREAMTRAIN_PORT_BASE; default 19092].", show_default=False)] = None,
) -> None:
    """Start local Kafka, etcd and Redis (those not already running); wait until healthy."""
    services = _services(home, port_base)
    try:
        started = services.up()
    except InfraError as exc:
        err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(1) from exc
    for status in services.status():
        took = started.get(status.name)
        how = ("external" if status.external else
               "already running" if took is None else f"ready in {took:.1f} s")
        console.print(f"{status.name:6} {how:18} {status.address}")


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
    keep: Annotated[bool, typer.Option("--keep", help="Leave the services running.")] = False,
) -> None:
    """Services up, a topic created, an Example record round-tripped, services down."""
    from streamtrain.demo import run_demo

    run_demo(_services(home), console, keep_running=keep)


def main() -> None:
    app()
