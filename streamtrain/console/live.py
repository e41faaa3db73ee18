"""The console's view of a running job: how it shows a `Snapshot` (`render` for the rich live
table, `headline` for the one-line headless log) and the loop that refreshes it (`follow`), for
`streamtrain demo` and `streamtrain job run`. What is shown is read by
`streamtrain.monitor.JobMonitor`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text

from streamtrain.local import LocalJob, shard_of_child
from streamtrain.monitor import ROLLING_TASKS, Snapshot
from streamtrain.runtime.supervisor import Supervisor
from streamtrain.schemas import partition_of

if TYPE_CHECKING:
    from rich.console import Console

REFRESH_S = 0.5
HEADLINE_EVERY_S = 5.0


def follow(job: LocalJob, stop: threading.Event, deadline: float | None, events: list[str],
           show: Callable[[Snapshot], None],
           on_tick: Callable[[float, Supervisor], None] | None = None) -> Snapshot | None:
    """Refresh the view of `job` every REFRESH_S until `stop` is set or the monotonic `deadline`
    passes; the children's events are added to `events`. Returns the last snapshot."""
    snap = None
    while not stop.is_set() and (deadline is None or time.monotonic() < deadline):
        if on_tick is not None:
            assert job.monitor is not None and job.supervisor is not None  # ticks are of a started job
            on_tick(time.monotonic() - job.monitor.started, job.supervisor)
        events.extend(job.events())
        snap = job.status()
        show(snap)
        stop.wait(REFRESH_S if deadline is None else max(0.0, min(REFRESH_S, deadline - time.monotonic())))
    return snap


def headlines(console: Console, supervisor: Supervisor, events: list[str]) -> Callable[[Snapshot], None]:
    """A `show` for `follow` without a screen: each event as it comes, a headline every
    HEADLINE_EVERY_S."""
    last = [0.0]

    def show(snap: Snapshot) -> None:
        while events:
            console.print(f"event: {events.pop(0)}", highlight=False, markup=False)
        if time.monotonic() - last[0] >= HEADLINE_EVERY_S:
            last[0] = time.monotonic()
            console.print(headline(snap, supervisor), highlight=False, markup=False, soft_wrap=True)

    return show


# ------------------------------------------------------------------------------ rendering


def _num(value: float | int | None, fmt: str = "{:,.0f}", none: str = "–") -> str:
    return none if value is None else fmt.format(value)


def headline(snap: Snapshot, supervisor: Supervisor) -> str:
    """One plain line for logs and CI."""
    q = snap.queues
    procs = " ".join(f"{c.name}:{'up' if c.state == 'running' else c.state}"
                     + (f"(r{c.restarts})" if c.restarts else "") for c in list(supervisor.children.values()))
    return (f"t={snap.elapsed_s:5.0f}s lag={_num(snap.lag)} "
            f"tasks todo/pending/done/failed={q.get('todo', '?')}/{q.get('pending', '?')}/"
            f"{q.get('done', '?')}/{q.get('failed', '?')} examples={snap.examples} "
            f"ex/s={_num(snap.examples_per_s)} auc={_num(snap.auc, '{:.4f}')} "
            f"loss={_num(snap.loss, '{:.4f}')} event->trained={_num(snap.event_to_trained_s, '{:.1f}s')} "
            f"[{procs}]")


def render(snap: Snapshot, supervisor: Supervisor, job: str, events: list[str]) -> Group:
    """The live screen, compact enough for an 80x24 terminal: the job, quality, freshness, then
    one row per process (pserver rows carry their shard's counters)."""
    top = Table.grid(padding=(0, 2))
    top.add_column(style="bold")
    top.add_column()
    q = snap.queues
    top.add_row("job", f"{job}   {snap.elapsed_s:,.0f} s   trainers {snap.trainers}   pservers {snap.pservers}")
    parts = "  ".join(f"p{partition_of(p)[1]} {_num(v)}" for p, v in sorted(snap.lag_by_partition.items()))
    top.add_row("input lag", f"{_num(snap.lag)} records" + (f"   ({parts})" if parts else ""))
    top.add_row("tasks", f"todo {q.get('todo', '–')}   pending {q.get('pending', '–')}   "
                         f"done {q.get('done', '–')}   failed {q.get('failed', '–')}   "
                         f"[dim]({snap.tasks_reported:,} finished)[/dim]")
    top.add_row("throughput", f"{_num(snap.examples_per_s)} examples/s   {snap.examples:,} trained   "
                              f"{_num(snap.applied)} applied")
    top.add_row("quality", f"prequential AUC [bold green]{_num(snap.auc, '{:.4f}')}[/bold green]   "
                           f"log-loss {_num(snap.loss, '{:.4f}')}   [dim](last {ROLLING_TASKS} tasks)[/dim]")
    top.add_row("freshness", f"event → trained {_num(snap.event_to_trained_s, '{:.1f} s')} [dim](median)[/dim]"
                             f"   newest trained event {_num(snap.newest_trained_age_s, '{:.1f} s')} old")
    if snap.timings:
        top.add_row("per task", "   ".join(f"{k[:-2]} {v:.2f} s" for k, v in snap.timings.items()))

    procs = Table("process", "state", "pid", "restarts", "exit", "detail", box=box.SIMPLE_HEAD,
                  padding=(0, 1), pad_edge=False)
    colours = {"running": "green", "restarting": "yellow", "stopped": "dim", "retired": "dim"}
    for c in list(supervisor.children.values()):  # a copy: LocalJob's poller may add a shard
        colour = colours.get(c.state, "red")
        detail = ""
        if (i := shard_of_child(c.name)) is not None:
            s = snap.shards[i] if i < len(snap.shards) else None
            if s is not None:
                detail = (f"v{s.version}  {s.examples:,} applied  {s.checkpoints} ckpt"
                          + (f"  {s.dropped:,} dups" if s.dropped else ""))
        elif c.name == "master" and c.pid is not None:
            detail = "leader" if snap.leader_pid == c.pid else "standby"
        procs.add_row(c.name, f"[{colour}]{c.state}[/{colour}]", _num(c.pid, "{}"), str(c.restarts),
                      _num(c.last_exit, "{}"), detail)

    shown: list[Table | Text] = [top, procs]
    if events or snap.errors:
        shown.append(Text("\n".join([*events[-3:], *snap.errors[-2:]]), style="dim"))
    shown.append(Text("Ctrl-C stops the demo: children get SIGTERM, then the services stop.", style="dim"))
    return Group(*shown)
