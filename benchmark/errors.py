"""Errors raised by the benchmark store; each carries its gRPC status through ``rpc.errors``."""

from __future__ import annotations

from rpc.errors import InvalidArgument, NotFound


class BenchmarkNotFound(NotFound):
    """No benchmark (or suite, or image) answers to the reference the caller gave."""


class BenchmarkInvalid(InvalidArgument):
    """A benchmark, or a manifest about to become one, breaks the format.

    ``problems`` holds every problem found, each naming the item id or file and what is wrong, so
    that one attempt shows all that needs fixing.
    """

    def __init__(self, path_or_ref: str, problems: list[str]) -> None:
        self.path_or_ref = str(path_or_ref)
        self.problems = list(problems)
        count = len(self.problems)
        lines = "\n".join(f"  - {problem}" for problem in self.problems)
        noun = "problem" if count == 1 else "problems"
        super().__init__(f"benchmark {self.path_or_ref!r} is invalid ({count} {noun}):\n{lines}")
