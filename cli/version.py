"""Vigil's version, recorded with every response."""

from importlib.metadata import PackageNotFoundError, version

try:
    VIGIL_VERSION = version("vigil")
except PackageNotFoundError:  # pragma: no cover - running from a tree without install
    VIGIL_VERSION = "0.0.0+unknown"
