"""Importers: turn data a user holds into a Vigil benchmark, checked before anything is written.

Each importer module has ``collect(path, seed) -> Collected`` (rows, images and every problem it
met, naming the file and what is wrong); :func:`run_import` then checks the whole manifest (schema,
images, duplicate ids, option sets, paths, label consistency) and stores it atomically, or raises
BenchmarkInvalid listing every problem and writes nothing.

- ``brats``: BraTS 2024 subject folders (t1n, t1c, t2w, t2f, seg).
- ``ixi``: IXI T1, T2, PD and MRA volumes (healthy subjects).
- ``nifti``: NIfTI volumes labelled by a CSV (:mod:`benchmark.importers.nifti_csv`).
- ``dicom``: DICOM series labelled from their metadata.
- ``medrcube``: MedRCube's released format (:mod:`benchmark.medrcube`).

:func:`add_import_export_commands` adds ``vigil benchmark import`` and ``vigil benchmark export``.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path
from typing import Any

from benchmark.errors import BenchmarkInvalid, BenchmarkNotFound

IMPORTERS: dict[str, str] = {
    "brats": "benchmark.importers.brats",
    "ixi": "benchmark.importers.ixi",
    "nifti": "benchmark.importers.nifti_csv",
    "dicom": "benchmark.importers.dicom",
    "medrcube": "benchmark.medrcube",
}
"""Importer name -> module providing ``collect(path, seed)``."""

EXPORTERS: tuple[str, ...] = ("medrcube",)
EXIT_OK, EXIT_INVALID, EXIT_USAGE = 0, 1, 2


def run_import(kind: str, path: Path, root: Path, name: str | None = None, seed: int = 0) -> Any:
    """Import ``path`` with importer ``kind`` into the store at ``root``; returns the Benchmark.

    Raises BenchmarkNotFound for an unknown importer, BenchmarkInvalid listing every problem
    (then nothing is written).
    """
    from benchmark.importers.common import default_name, store_import

    if kind not in IMPORTERS:
        raise BenchmarkNotFound(f"unknown importer {kind!r}; choose from {', '.join(IMPORTERS)}")
    module = importlib.import_module(IMPORTERS[kind])
    path = Path(path)
    collected = module.collect(path, seed)
    name = name or default_name(kind, path)
    return store_import(
        path,
        Path(root),
        name,
        f"import-{kind}",
        collected.rows,
        collected.images,
        collected.problems,
        seed,
    )


def _fail(problems: list[str], where: str) -> int:
    for problem in problems:
        print(problem, file=sys.stderr)
    noun = "problem" if len(problems) == 1 else "problems"
    print(f"vigil benchmark: error: {where}: {len(problems)} {noun}; nothing written",
          file=sys.stderr)  # fmt: skip
    return EXIT_INVALID


def _usage(message: str) -> int:
    print(f"vigil benchmark: error: {message}", file=sys.stderr)
    return EXIT_USAGE


def cmd_import(args: argparse.Namespace) -> int:
    from benchmark.store import default_root

    root = Path(args.root) if args.root is not None else default_root()
    path = Path(args.path)
    if not path.exists():
        return _usage(f"{path}: no such file or folder")
    if args.name is not None:
        from benchmark.format import check_name

        why = check_name(args.name)
        if why is not None:
            return _usage(why)
    try:
        bench = run_import(args.kind, path, root, args.name, args.seed)
    except BenchmarkNotFound as exc:
        return _usage(exc.message)
    except BenchmarkInvalid as exc:
        return _fail(exc.problems, exc.path_or_ref)
    except OSError as exc:  # an unreadable source file or folder, or a store that cannot be written
        return _fail([f"{exc.filename or root}: {exc.strerror or exc}"], str(path))
    counts = bench.items(["image_missing"])["image_missing"] if bench else None
    print(f"id        {bench.id}")
    print(f"items     {bench.meta.item_count}")
    print(f"subjects  {bench.meta.subject_count}")
    if counts is not None and bool(counts.any()):
        print(f"missing   {int(counts.sum())} item(s) without an image (text-only runs only)")
    print(f"hash      {bench.content_hash}")
    print(f"path      {bench.path.resolve()}")
    return EXIT_OK


def cmd_export(args: argparse.Namespace) -> int:
    from benchmark import medrcube
    from benchmark.store import default_root, open_benchmark

    root = Path(args.root) if args.root is not None else default_root()
    try:
        bench = open_benchmark(args.ref, root)
    except BenchmarkNotFound as exc:
        return _usage(exc.message)
    except BenchmarkInvalid as exc:
        return _fail(exc.problems, exc.path_or_ref)
    try:
        summary = medrcube.export(bench, Path(args.out_dir))
    except BenchmarkInvalid as exc:
        return _fail(exc.problems, exc.path_or_ref)
    except OSError as exc:
        return _fail([f"cannot write {args.out_dir}: {exc.strerror or exc}"], str(args.out_dir))
    print(f"files     {summary.files}")
    print(f"items     {summary.items}")
    print(f"images    {summary.images}")
    if summary.skipped:
        print(f"skipped   {summary.skipped} (open-ended or abstention: no option is the answer)")
    print(f"path      {summary.out_dir.resolve()}")
    return EXIT_OK


def add_import_export_commands(commands: argparse._SubParsersAction, root_help: str) -> None:
    """Add ``import`` and ``export`` to the ``vigil benchmark`` command group."""
    imp = commands.add_parser(
        "import",
        help="import real data (BraTS, IXI, NIfTI + CSV, DICOM, MedRCube) as a benchmark",
        description="Import a folder of real data into the store. Every problem is listed (file "
        "and what is wrong) and nothing is written when there is any; exit status 1.",
    )
    imp.add_argument("kind", choices=sorted(IMPORTERS), help="the layout of PATH")
    imp.add_argument("path", help="the folder (or, for nifti, the CSV file) to import")
    imp.add_argument("--name", default=None, help="benchmark name (default: <kind>-<folder>)")
    imp.add_argument("--seed", type=int, default=0, help="seed of the option orders (default 0)")
    imp.add_argument("--root", type=Path, default=None, help=root_help)
    imp.set_defaults(handler=cmd_import)

    exp = commands.add_parser(
        "export",
        help="export a benchmark in another format (medrcube)",
        description="Write a stored benchmark in MedRCube's released format.",
    )
    exp.add_argument("format", choices=EXPORTERS, help="the format to write")
    exp.add_argument("ref", metavar="ID_OR_PATH", help="benchmark folder, or an id or name")
    exp.add_argument("out_dir", type=Path, metavar="OUT_DIR", help="folder to create")
    exp.add_argument("--root", type=Path, default=None, help=root_help)
    exp.set_defaults(handler=cmd_export)
