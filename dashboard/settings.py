"""Dashboard settings, read from ``VIGIL_DASHBOARD_*`` (and, for ``vigil serve dashboard``, flags).

``streamlit run`` cannot take Vigil's flags, so ``vigil serve dashboard`` hands the settings to
the Streamlit process as ``VIGIL_DASHBOARD_*`` environment variables (:func:`settings_env`) and
the app builds :class:`DashboardSettings` from them once per page render.
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

ENV_PREFIX = "VIGIL_DASHBOARD_"


def _data_dir() -> Path:
    return Path(os.environ.get("VIGIL_DATA_DIR", "var"))


class DashboardSettings(BaseSettings):
    """Where the dashboard listens and which services it reads from."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="forbid")

    grader_address: str = "127.0.0.1:50052"
    """The grader's gRPC address (host:port): metrics, trends, reliability bins and alerts."""
    gateway_address: str = "127.0.0.1:50051"
    """The gateway's gRPC address (host:port): endpoints and runs."""
    host: str = "127.0.0.1"
    """The interface Streamlit's HTTP server binds."""
    port: int = Field(default=8501, ge=1, le=65535)
    """The HTTP port. It must be explicit: Streamlit cannot report an OS-assigned port (0)."""
    benchmark_root: Path = Field(default_factory=lambda: _data_dir() / "benchmarks")
    """Where benchmark folders live (read-only; the dashboard never writes there)."""
    rpc_timeout_s: float = Field(default=5.0, gt=0)
    """The deadline of every gRPC call the dashboard makes, in seconds."""


def settings_env(settings: DashboardSettings) -> dict[str, str]:
    """``settings`` as ``VIGIL_DASHBOARD_*`` variables that rebuild it in another process."""
    return {
        f"{ENV_PREFIX}{name.upper()}": str(value) for name, value in settings.model_dump().items()
    }
