"""`streamtrain job run`: a whole job on this machine under the restarting supervisor.

The job file's processes run as a `streamtrain.local.LocalJob`: `python -m streamtrain …`
children of one supervisor (the demo's): one master, `pservers.count` shards (pinned to their
indexes) and N trainers, each with the current endpoints (`Endpoints.resolve()`) in its
environment and its output in `<log dir>/<name>.log`. A child that exits unexpectedly is
restarted with backoff. A status line (`live.headline`) is printed every few seconds, and an
event when a bounded job has trained its last pass. Ctrl-C or SIGTERM stops the children
(SIGTERM, grace period, SIGKILL) and returns.

Unlike `streamtrain demo`, nothing else is started: the services and the input topic must exist.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from rich.console import Console

from streamtrain.local import LocalJob, LocalJobResult

STATE_CHECK_S = 1.0


def run_job(job: LocalJob, console: Console, stop: threading.Event | None = None) -> LocalJobResult:
    """Run `job` (not yet started) until SIGINT/SIGTERM or `stop` is set; print its status
    meanwhile and a summary at the end."""
    from streamtrain.console.live import follow, headline, headlines
    from streamtrain.infra.signals import handle_stop_signals

    stop = stop or threading.Event()
    restore = handle_stop_signals(stop)
    events: list[str] = []
    state: dict[str, Any] = {"value": None, "checked": 0.0}
    snap = None
    try:
        console.print(f"job    {job.name}  ({job.config.pservers.count} pservers, {job.trainers} trainers)",
                      highlight=False)
        if job.job_file is not None:
            console.print(f"file   {job.job_file}", highlight=False, soft_wrap=True)
        console.print(f"logs   {job.log_dir}", highlight=False, soft_wrap=True)
        e = job.endpoints
        console.print(f"kafka  {e.kafka}  etcd {e.etcd}  redis {e.redis}", highlight=False)
        job.start()

        def watch_state(_elapsed: float, _supervisor) -> None:
            now = time.monotonic()
            if now - state["checked"] < STATE_CHECK_S:
                return
            state["checked"] = now
            try:
                value = job.state()
            except Exception:  # noqa: BLE001  the status view never dies of a slow service
                return
            if value != state["value"]:
                state["value"] = value
                if value == "finished":
                    events.append(f"job {job.name} finished its last pass over the input; Ctrl-C to stop")

        assert job.supervisor is not None  # started above
        snap = follow(job, stop, None, events, headlines(console, job.supervisor, events), watch_state)
    finally:
        result = job.stop()
        restore()
    snap = job.final_status or snap
    if snap is not None and job.supervisor is not None:
        console.print(headline(snap, job.supervisor), highlight=False, markup=False, soft_wrap=True)
    restarts = {k: v for k, v in result.restarts.items() if v}
    killed = result.killed
    console.print(f"stopped after {result.duration_s:.0f} s; state {result.state or '-'}; restarts "
                  f"{sum(restarts.values())}" + (f" {restarts}" if restarts else "")
                  + (f"; needed SIGKILL: {', '.join(killed)}" if killed else "")
                  + (f"; [red]stray processes {result.stray}[/red]" if result.stray else "; no stray process"),
                  highlight=False)
    return result
