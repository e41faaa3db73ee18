"""Errors raised while preparing, starting or probing the local services."""

from streamtrain.schemas import StreamtrainError


class InfraError(StreamtrainError, RuntimeError):
    """Root of every infra/ error."""


class MissingDependencyError(InfraError):
    """A program the services need is not installed; the message names the install command."""

    def __init__(self, program: str, install: str) -> None:
        super().__init__(f"'{program}' was not found on PATH; install it with: {install}")
        self.program = program
        self.install = install


class ServiceStartError(InfraError):
    """A service process exited or never became healthy; the message points at its log."""
