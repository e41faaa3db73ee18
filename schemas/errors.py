"""The root of every streamtrain error, and the one exception every schema raises."""

from __future__ import annotations


class StreamtrainError(Exception):
    """Root of every error streamtrain raises on purpose: `except StreamtrainError` catches them
    all, while each also derives from the built-in type that fits it (ValueError for bad input,
    RuntimeError for a failed operation)."""


class SchemaError(StreamtrainError, ValueError):
    """A value does not fit its format: raised by decoders and by constructors alike.

    Attributes:
        format: the format's name, e.g. ``"GradientDelta"``.
        field: where in the value it went wrong, e.g. ``"sparse[0].values"``.
        reason: what is wrong, without the format and field.
        version: the format version that was being read or written (None for key builders).
    """

    def __init__(self, format: str, field: str, reason: str, version: int | None = None) -> None:
        label = format if version is None else f"{format} v{version}"
        super().__init__(f"{label}: field '{field}': {reason}")
        self.format = format
        self.field = field
        self.reason = reason
        self.version = version

    # The default pickling replays args=(message,), which this __init__ cannot take; errors
    # cross process boundaries too (multiprocessing pools, executors).
    def __reduce__(self):
        return (type(self), (self.format, self.field, self.reason, self.version))
