"""``vigil serve dashboard``: run the Streamlit app as a child process.

``streamlit run`` cannot take Vigil's flags, so the settings travel to the app as
``VIGIL_DASHBOARD_*`` environment variables. The dashboard needs an explicit port: Streamlit
cannot bind port 0 and report the port it got, so ``--port 0`` is refused. ``--ready-file`` is
written (``{"port": N}``) once Streamlit answers ``/_stcore/health``; ``--metrics-port`` is
accepted for symmetry with the other services and ignored (the dashboard exports no metrics).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import FrameType

from dashboard.settings import DashboardSettings, settings_env
from rpc.server import write_ready_file

log = logging.getLogger("vigil.dashboard")

APP_PATH = Path(__file__).resolve().with_name("app.py")
_FORWARDED = (signal.SIGTERM, signal.SIGINT)


def streamlit_command(settings: DashboardSettings) -> list[str]:
    """The child's command line."""
    return [
        sys.executable, "-m", "streamlit", "run", str(APP_PATH),
        "--server.port", str(settings.port),
        "--server.address", settings.host,
        "--server.headless", "true",
        "--server.fileWatcherType", "none",
        "--browser.gatherUsageStats", "false",
        # Oversight readers get the viewer's menu, without deploy / rerun / clear-cache.
        "--client.toolbarMode", "viewer",
    ]  # fmt: skip


def health_url(settings: DashboardSettings) -> str:
    """Streamlit's health endpoint; a wildcard bind is polled on loopback."""
    host = settings.host
    if host in ("", "0.0.0.0"):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{settings.port}/_stcore/health"


def wait_healthy(url: str, child: subprocess.Popen[bytes], timeout_s: float = 120.0) -> bool:
    """Poll ``url`` until it answers 200; False if the child exits or time runs out first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and child.poll() is None:
        try:
            with urllib.request.urlopen(url, timeout=2) as reply:  # noqa: S310 - our own URL
                if reply.status == 200:
                    return True
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.2)
    return False


def _announce_ready(url: str, child: subprocess.Popen[bytes], ready_file: Path | None,
                    port: int) -> None:  # fmt: skip
    if wait_healthy(url, child):
        log.info("dashboard serving at %s", url.removesuffix("/_stcore/health"))
        write_ready_file(str(ready_file) if ready_file else None, {"port": port})
    elif child.poll() is None:
        log.warning("dashboard did not answer %s in time", url)


def serve(settings: DashboardSettings, ready_file: Path | None = None) -> int:
    """Run Streamlit until it exits; SIGTERM / SIGINT are passed on. Returns its exit status."""
    env = {**os.environ, **settings_env(settings)}
    cmd = streamlit_command(settings)
    log.info("starting the dashboard on %s:%d (grader %s, gateway %s)", settings.host,
             settings.port, settings.grader_address, settings.gateway_address)  # fmt: skip
    child = subprocess.Popen(cmd, env=env)

    def forward(signum: int, _frame: FrameType | None) -> None:
        if child.poll() is None:
            child.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in _FORWARDED}
    watcher = threading.Thread(
        target=_announce_ready,
        args=(health_url(settings), child, ready_file, settings.port),
        name="dashboard-ready",
        daemon=True,
    )
    watcher.start()
    try:
        while True:
            try:
                code = child.wait()
                break
            except KeyboardInterrupt:  # pragma: no cover - a handler was replaced
                forward(signal.SIGINT, None)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    # A child killed by a signal reports -N; report it the way a shell would.
    return 128 - code if code < 0 else code


def add_serve_dashboard_command(serve_parsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = serve_parsers.add_parser(
        "dashboard",
        help="the Streamlit dashboard (read-only; reads the grader and the gateway over gRPC)",
        description="Run the dashboard. It needs an explicit port: Streamlit cannot report an "
        "OS-assigned one, so --port 0 is refused.",
    )
    p.add_argument("--host", help="interface to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="HTTP port (default 8501; must not be 0)")
    p.add_argument("--grader-address", help="the grader (default 127.0.0.1:50052)")
    p.add_argument("--gateway-address", help="the gateway (default 127.0.0.1:50051)")
    p.add_argument("--benchmark-root", type=Path, help="benchmark folders (default var/benchmarks)")
    p.add_argument("--rpc-timeout-s", type=float, help="deadline of each gRPC call (default 5)")
    p.add_argument(
        "--ready-file", type=Path, help='write {"port": N} here once the page answers HTTP'
    )
    p.add_argument(
        "--metrics-port", type=int, help="accepted for symmetry; ignored (no metrics exported)"
    )
    p.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    from cli.common import UsageError, settings_from_args

    if args.port == 0:
        raise UsageError(
            "the dashboard needs an explicit --port: Streamlit cannot report an OS-assigned port"
        )
    settings = settings_from_args(DashboardSettings, args)
    return serve(settings, args.ready_file)
