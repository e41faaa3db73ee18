"""streamtrain: streaming, fault-tolerant distributed training.

The Python API is small:

    from streamtrain import JobConfig, LocalJob

    with LocalJob(JobConfig.load("job.toml"), trainers=2) as job:
        job.wait_finished()

`JobConfig` (streamtrain.schemas.config) defines a job, `LocalJob` (streamtrain.local) runs it
as local processes, `Endpoints` (streamtrain.infra) names the services (`LocalServices` starts
local ones, as `streamtrain up` does), and `Predictor`
(streamtrain.predict) scores records with the served parameters. The `streamtrain` command
(streamtrain.cli) is built on the same parts.

The names load on first use: every job process starts as `python -m streamtrain …`, and must
not pay for imports it does not need (a restarted trainer's start-up is mostly imports).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from streamtrain.infra import Endpoints, LocalServices
    from streamtrain.schemas.config import JobConfig, JobConfigError
    from streamtrain.local import LocalJob, LocalJobError, LocalJobResult
    from streamtrain.predict import Predictor
    from streamtrain.schemas import StreamtrainError

_EXPORTS = {
    "Endpoints": "streamtrain.infra",
    "JobConfig": "streamtrain.schemas.config",
    "JobConfigError": "streamtrain.schemas.config",
    "LocalJob": "streamtrain.local",
    "LocalJobError": "streamtrain.local",
    "LocalJobResult": "streamtrain.local",
    "LocalServices": "streamtrain.infra",
    "Predictor": "streamtrain.predict",
    "StreamtrainError": "streamtrain.schemas",
}
# Spelled out (it is sorted(_EXPORTS)) so that linters see the TYPE_CHECKING imports exported.
__all__ = ["Endpoints", "JobConfig", "JobConfigError", "LocalJob", "LocalJobError", "LocalJobResult", "LocalServices",
           "Predictor", "StreamtrainError"]


def __getattr__(name: str) -> object:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'streamtrain' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
