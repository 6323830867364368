"""``vigil benchmark``: build, validate and list benchmarks.

:func:`add_benchmark_commands` adds the command group to the ``vigil`` parser. Each command sets
``handler`` on the parsed arguments; ``args.handler(args)`` runs it and returns the exit code:
0 success, 1 the benchmark is invalid or the work failed, 2 a usage mistake (unknown suite, size or
benchmark). User mistakes print one line to stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from benchmark.errors import BenchmarkInvalid, BenchmarkNotFound
from benchmark.store import (
    default_root,
    ensure_builtin,
    list_benchmarks,
    open_benchmark,
    write_benchmark,
)
from benchmark.validate import validate_benchmark

EXIT_OK, EXIT_INVALID, EXIT_USAGE = 0, 1, 2


def _error(message: str) -> None:
    first = message.strip().splitlines()[0] if message.strip() else "error"
    print(f"vigil benchmark: error: {first}", file=sys.stderr)


def _one_line(exc: BenchmarkInvalid) -> str:
    return "; ".join(exc.problems) or exc.message


def _root(args: argparse.Namespace) -> Path:
    return Path(args.root) if args.root is not None else default_root()


def cmd_build(args: argparse.Namespace) -> int:
    from benchmark.suites import build_suite, suite_sizes

    root = _root(args)
    progress = not args.no_progress
    try:
        sizes = suite_sizes(args.suite)
    except BenchmarkNotFound as exc:
        _error(exc.message)
        return EXIT_USAGE
    if args.size not in sizes:
        _error(f"unknown size {args.size!r} for {args.suite}; choose from {', '.join(sizes)}")
        return EXIT_USAGE
    if args.seed < 0:
        _error(f"--seed must be 0 or more, got {args.seed}")
        return EXIT_USAGE
    try:
        if args.force:
            manifest, images = build_suite(args.suite, args.size, args.seed, progress=progress)
            bench = write_benchmark(
                root,
                f"{args.suite}-{args.size}",
                args.suite,
                args.size,
                args.seed,
                manifest,
                images,
            )
        else:
            bench = ensure_builtin(root, args.suite, args.size, args.seed, progress=progress)
    except BenchmarkInvalid as exc:
        _error(f"{exc.path_or_ref}: {_one_line(exc)}")
        return EXIT_INVALID
    except OSError as exc:
        _error(f"cannot write under {root}: {exc.strerror or exc}")
        return EXIT_INVALID
    print(f"id        {bench.id}")
    print(f"items     {bench.meta.item_count}")
    print(f"subjects  {bench.meta.subject_count}")
    print(f"hash      {bench.content_hash}")
    print(f"path      {bench.path.resolve()}")
    return EXIT_OK


def cmd_validate(args: argparse.Namespace) -> int:
    target = Path(args.path)
    if not target.is_dir():
        try:
            target = open_benchmark(args.path, _root(args)).path
        except BenchmarkNotFound as exc:
            _error(exc.message)
            return EXIT_USAGE
        except BenchmarkInvalid as exc:
            target = Path(exc.path_or_ref)
    problems = validate_benchmark(target)
    for problem in problems:
        print(problem)
    if problems:
        noun = "problem" if len(problems) == 1 else "problems"
        print(f"invalid: {len(problems)} {noun} in {target}", file=sys.stderr)
        return EXIT_INVALID
    print("valid")
    return EXIT_OK


def cmd_list(args: argparse.Namespace) -> int:
    root = _root(args)
    benchmarks = list_benchmarks(root)
    if not benchmarks:
        print(f"no benchmarks under {root}")
        return EXIT_OK
    header = ("id", "suite", "size", "seed", "items", "subjects", "created_by")
    rows = [
        (
            b.id,
            b.meta.suite,
            b.meta.size,
            str(b.meta.seed),
            str(b.meta.item_count),
            str(b.meta.subject_count),
            b.meta.created_by,
        )
        for b in benchmarks
    ]
    widths = [max(len(r[i]) for r in (header, *rows)) for i in range(len(header))]
    for row in (header, *rows):
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    return EXIT_OK


def add_benchmark_commands(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add the ``benchmark`` command group (build, validate, list) to a parser's subcommands."""
    root_help = "benchmark store folder (default: $VIGIL_DATA_DIR/benchmarks, i.e. var/benchmarks)"
    parser = subparsers.add_parser(
        "benchmark",
        help="build, validate and list benchmarks",
        description="Build, validate and list the immutable benchmarks Vigil replays.",
    )
    commands = parser.add_subparsers(dest="benchmark_command", metavar="COMMAND", required=True)

    build = commands.add_parser(
        "build",
        help="build a built-in suite (reuses an identical stored build)",
        description="Build a built-in suite into the store and print its id, counts and hash.",
    )
    build.add_argument("suite", help="suite name, e.g. brain-mri")
    build.add_argument("--size", default="small", help="small (default), small-full or paper")
    build.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    build.add_argument("--root", type=Path, default=None, help=root_help)
    build.add_argument(
        "--force", action="store_true", help="rebuild even if a build of this size and seed exists"
    )
    build.add_argument("--no-progress", action="store_true", help="no progress bar")
    build.set_defaults(handler=cmd_build)

    validate = commands.add_parser(
        "validate",
        help="check a benchmark folder; prints every problem",
        description="Check a benchmark folder (or id or name under --root) and print every "
        "problem; exit status 1 if there are any.",
    )
    validate.add_argument("path", help="benchmark folder, or an id or name under --root")
    validate.add_argument("--root", type=Path, default=None, help=root_help)
    validate.set_defaults(handler=cmd_validate)

    listing = commands.add_parser("list", help="list stored benchmarks")
    listing.add_argument("--root", type=Path, default=None, help=root_help)
    listing.set_defaults(handler=cmd_list)

    from benchmark.importers import add_import_export_commands

    add_import_export_commands(commands, root_help)  # import ... / export medrcube ...
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``vigil benchmark ...`` on its own (``python -m benchmark.cli benchmark build ...``)."""
    parser = argparse.ArgumentParser(prog="vigil")
    add_benchmark_commands(parser.add_subparsers(dest="command", metavar="COMMAND", required=True))
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args))
    except KeyboardInterrupt:
        _error("interrupted")
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
