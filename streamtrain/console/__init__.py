"""The console: what a person watches while a job runs on this machine.

- `live.py`: the view of a running job (a rich live table, or a one-line headline for logs)
  refreshed from `LocalJob.status()`;
- `jobrun.py`: `streamtrain job run`, a `LocalJob` with a headline every few seconds;
- `demo.py`: `streamtrain demo`, services, a synthetic stream and a job, with the live view.

Built on `LocalJob` (streamtrain/local.py) and below the CLI, which calls them. Nothing is
imported here: rich loads only for a command that shows it.
"""
