"""Errors of the producers and the joiner. Callers never catch Kafka's or pyarrow's."""

from streamtrain.schemas import StreamtrainError


class ProducerError(StreamtrainError, RuntimeError):
    """Root of every producers/ error."""


class DeliveryError(ProducerError):
    """Kafka refused or timed out records; the message names the topic and the broker's reason."""


class ReplayError(ProducerError):
    """A file to replay cannot be read: missing, of an unknown format, or malformed (the message
    names the file and, where known, the row)."""
