"""streamtrain: streaming, fault-tolerant distributed training.

The Python API is small:

    from streamtrain import JobConfig, LocalJob

    with LocalJob(JobConfig.load("job.toml"), trainers=2) as job:
        job.wait_finished()

`JobConfig` (streamtrain.schemas.config) defines a job, `LocalJob` (streamtrain.local) runs it
as local processes, `Endpoints` (streamtrain.infra) names the services (`LocalServices` starts
local ones, as `streamtrain up` does), and `Predictor` (streamtrain.operations.predict) scores
records with the served parameters. `LocalJob.status()` returns a `Snapshot`
(streamtrain.monitor), `LocalJob.checkpoint()` a `Checkpoint` and `LocalJob.resize()` a
`Resized` (streamtrain.operations). The `streamtrain` command (streamtrain.cli, run by
streamtrain.__main__) is built on the same parts; this package does not import it.

The names load on first use: every job process starts as `python -m streamtrain …`, and must
not pay for imports it does not need (a restarted trainer's start-up is mostly imports).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from streamtrain.infra import Endpoints, LocalServices
    from streamtrain.local import LocalJob, LocalJobError, LocalJobResult
    from streamtrain.monitor import Snapshot
    from streamtrain.operations.checkpoints import Checkpoint, CheckpointError
    from streamtrain.operations.predict import Predictor
    from streamtrain.operations.resizing import Resized, ResizeError
    from streamtrain.schemas import StreamtrainError
    from streamtrain.schemas.config import JobConfig, JobConfigError

    __version__: str

_EXPORTS = {
    "Checkpoint": "streamtrain.operations.checkpoints",
    "CheckpointError": "streamtrain.operations.checkpoints",
    "Endpoints": "streamtrain.infra",
    "JobConfig": "streamtrain.schemas.config",
    "JobConfigError": "streamtrain.schemas.config",
    "LocalJob": "streamtrain.local",
    "LocalJobError": "streamtrain.local",
    "LocalJobResult": "streamtrain.local",
    "LocalServices": "streamtrain.infra",
    "Predictor": "streamtrain.operations.predict",
    "ResizeError": "streamtrain.operations.resizing",
    "Resized": "streamtrain.operations.resizing",
    "Snapshot": "streamtrain.monitor",
    "StreamtrainError": "streamtrain.schemas",
}
# Spelled out (it is "__version__" and sorted(_EXPORTS), which a unit test checks) so that
# linters see the TYPE_CHECKING imports exported.
__all__ = ["Checkpoint", "CheckpointError", "Endpoints", "JobConfig", "JobConfigError", "LocalJob", "LocalJobError",
           "LocalJobResult", "LocalServices", "Predictor", "ResizeError", "Resized", "Snapshot", "StreamtrainError",
           "__version__"]


def _version() -> str:
    """The installed distribution's version (pyproject.toml); importlib.metadata is read only
    when asked, for the start-up's sake."""
    from importlib import metadata

    try:
        return metadata.version("streamtrain")
    except metadata.PackageNotFoundError:  # a source tree that was never installed
        return "0+unknown"


def __getattr__(name: str) -> object:
    if name == "__version__":
        globals()["__version__"] = version = _version()
        return version
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'streamtrain' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
