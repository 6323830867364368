"""The ``vigil`` command: one CLI, a subcommand per concern."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from cli.common import UsageError, setup_logging
from cli.version import VIGIL_VERSION
from rpc.errors import VigilError


def build_parser() -> argparse.ArgumentParser:
    from benchmark.cli import add_benchmark_commands
    from cli.client import add_client_commands
    from cli.up import add_up_command
    from dashboard.main import add_serve_dashboard_command
    from gateway.main import add_serve_gateway_command
    from grader.main import add_serve_grader_command
    from grader.offline import add_grade_command
    from model_servers.main import add_model_commands, add_serve_model_command
    from model_servers.reference.cli import add_reference_model_commands

    parser = argparse.ArgumentParser(
        prog="vigil",
        description="Continuous reliability audits of deployed medical-imaging VLMs.",
    )
    parser.add_argument("--version", action="version", version=f"vigil {VIGIL_VERSION}")
    parser.add_argument(
        "--log-level", default=os.environ.get("VIGIL_LOG_LEVEL", "INFO"), help="logging level"
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.required = True

    serve = commands.add_parser("serve", help="run one service").add_subparsers(
        dest="service", metavar="SERVICE"
    )
    serve.required = True
    add_serve_model_command(serve)
    add_serve_gateway_command(serve)
    add_serve_grader_command(serve)
    add_serve_dashboard_command(serve)

    add_benchmark_commands(commands)
    add_model_commands(commands)
    add_reference_model_commands(commands)
    add_up_command(commands)
    add_grade_command(commands)
    add_client_commands(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    setup_logging(args.log_level)
    try:
        return int(args.handler(args) or 0)
    except (UsageError, VigilError) as exc:
        print(f"vigil: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"vigil: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
