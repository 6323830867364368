"""Helpers shared by the CLI's commands."""

from __future__ import annotations

import argparse
import logging
import sys
from typing import TypeVar

from pydantic import ValidationError
from pydantic_settings import BaseSettings

S = TypeVar("S", bound=BaseSettings)


class UsageError(Exception):
    """A mistake in what the user asked for; printed as one line, no traceback."""


def settings_from_args(cls: type[S], args: argparse.Namespace) -> S:
    """Settings from the environment (``cls``'s prefix), overridden by flags that were given."""
    overrides = {
        name: value
        for name, value in vars(args).items()
        if name in cls.model_fields and value is not None
    }
    try:
        return cls(**overrides)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in exc.errors()
        )
        raise UsageError(f"invalid settings for {cls.__name__}: {problems}") from None


def setup_logging(level: str = "INFO") -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
