"""One exception hierarchy for every Vigil service; each class carries its gRPC status.

Servicers and the logic under them raise these; one server interceptor (``rpc.server``) maps them
to status codes. Anything else becomes INTERNAL with a generic message, so internals never leak.
"""

from __future__ import annotations

import grpc


class VigilError(Exception):
    """Base of Vigil's errors. ``code`` is the gRPC status a server answers with."""

    code: grpc.StatusCode = grpc.StatusCode.INTERNAL

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidArgument(VigilError):
    """The caller sent something malformed: a bad field, a bad image, a bad benchmark."""

    code = grpc.StatusCode.INVALID_ARGUMENT


class NotFound(VigilError):
    """An unknown model, endpoint, run or benchmark."""

    code = grpc.StatusCode.NOT_FOUND


class Unavailable(VigilError):
    """Not loaded or not ready yet; the caller may retry."""

    code = grpc.StatusCode.UNAVAILABLE


class ResourceExhausted(VigilError):
    """A queue or limit is full; the caller may retry later."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class DeadlineExceeded(VigilError):
    """The work ran past its deadline."""

    code = grpc.StatusCode.DEADLINE_EXCEEDED


class FailedPrecondition(VigilError):
    """The request is valid but the system is not in a state to honour it."""

    code = grpc.StatusCode.FAILED_PRECONDITION


RETRYABLE_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED})
