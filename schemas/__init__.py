"""Every format that crosses a process boundary in streamtrain, versioned.

A format is a frozen dataclass that validates itself when constructed, and encodes to JSON
(documents read by people and etcdctl: task records, manifests, dead letters, examples) or
to a little-endian binary framing (hot paths: examples, gradient deltas, parameters) that
starts with a 2-byte magic and a u8 version. Decoders are strict and cheap: arrays come back
as np.frombuffer views, and any malformed input, whether truncated, of an unknown version,
the wrong type or non-finite, raises one exception, SchemaError, naming the format and
field, so a long-running process can dead-letter the input and carry on.

Key and topic builders (EtcdKeys, RedisKeys, Topics) live here too: names are formats.
Byte-by-byte layouts: docs/schemas.md.
"""

from .checkpoint import CheckpointManifest, FileEntry
from .clicklog import ClickRecord, ImpressionRecord, JoinWaiting
from .control import (
                      ROLLBACK_PAUSE,
                      CheckpointRequest,
                      LatestCheckpoint,
                      PauseRequest,
                      ResizeRecord,
                      RollbackAck,
                      RollbackRequest,
                      ShardCheckpoint,
)
from .cursor import PartitionCursor
from .deadletter import DeadLetter
from .errors import SchemaError, StreamtrainError
from .example import Example
from .gradient import DenseSlice, GradientDelta, SparseRows, WireDtype
from .job import AppliedSteps, BarrierStats, BarrierSteps, Holder, JobState, ShardStats, SlotOwners
from .keys import CONTROLS, TASK_STATES, EtcdKeys, RedisKeys, Topics, partition_label, partition_of, validate_job_name
from .params import ParamBlock, decode_rows, encode_rows, encode_rows_matrix
from .report import TaskReport
from .rounds import FlushMark, PublishedRound, RoundRows
from .saved import (
                      ExampleCounts,
                      JobRecord,
                      KeptDocument,
                      LedgerEntry,
                      LedgerSnapshot,
                      SavedBlock,
                      SavedTable,
                      StateIndex,
)
from .services import ServicePorts
from .task import TaskId, TaskRecord

__all__ = [
    "AppliedSteps",
    "BarrierStats",
    "BarrierSteps",
    "CONTROLS",
    "TASK_STATES",
    "CheckpointManifest",
    "CheckpointRequest",
    "ClickRecord",
    "DeadLetter",
    "DenseSlice",
    "EtcdKeys",
    "Example",
    "ExampleCounts",
    "FileEntry",
    "FlushMark",
    "GradientDelta",
    "Holder",
    "ImpressionRecord",
    "JobRecord",
    "JobState",
    "JoinWaiting",
    "KeptDocument",
    "LatestCheckpoint",
    "LedgerEntry",
    "LedgerSnapshot",
    "ParamBlock",
    "PartitionCursor",
    "PauseRequest",
    "PublishedRound",
    "RedisKeys",
    "RollbackAck",
    "ROLLBACK_PAUSE",
    "ResizeRecord",
    "RollbackRequest",
    "RoundRows",
    "SavedBlock",
    "SavedTable",
    "SchemaError",
    "ServicePorts",
    "ShardCheckpoint",
    "ShardStats",
    "SlotOwners",
    "StreamtrainError",
    "SparseRows",
    "StateIndex",
    "TaskId",
    "TaskRecord",
    "TaskReport",
    "Topics",
    "WireDtype",
    "decode_rows",
    "encode_rows",
    "encode_rows_matrix",
    "partition_label",
    "partition_of",
    "validate_job_name",
]
