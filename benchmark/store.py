"""The content-addressed benchmark store: open, list and write immutable benchmark folders.

Gateway, grader and dashboard read benchmarks from here without locks: a benchmark folder only
ever appears whole (written under a ``.tmp-*`` name, fsynced, then renamed) and never changes
afterwards. See :mod:`benchmark.format` for the layout and the content hash.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections import Counter
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow.parquet as pq

from benchmark import format as fmt
from benchmark.errors import BenchmarkInvalid, BenchmarkNotFound
from benchmark.validate import meta_problems, validate_manifest


@dataclass(frozen=True)
class BenchmarkMeta:
    """The contents of ``benchmark.json`` (not part of the content hash)."""

    format_version: int
    name: str
    suite: str
    size: str
    seed: int
    content_hash: str
    item_count: int
    subject_count: int
    tasks: dict[str, int]
    created_by: str

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> BenchmarkMeta:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__})

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True) + "\n"


@dataclass(frozen=True)
class Benchmark:
    """An opened benchmark folder. Cheap to create; reads the manifest and images on demand."""

    path: Path
    meta: BenchmarkMeta

    @property
    def id(self) -> str:
        """The folder name, ``<name>-<content_hash[:12]>``."""
        return self.path.name

    @property
    def content_hash(self) -> str:
        return self.meta.content_hash

    def items(self, columns: list[str] | None = None) -> pd.DataFrame:
        """The manifest as a DataFrame (only ``columns`` when given). ``options`` and
        ``supported_findings`` hold lists. A version 1 manifest gets the version 2 columns with
        their defaults (:data:`benchmark.format.COLUMN_DEFAULTS`)."""
        if columns is not None:
            unknown = [c for c in columns if c not in fmt.COLUMNS]
            if unknown:
                raise BenchmarkInvalid(self.id, [f"unknown manifest column {c!r}" for c in unknown])
        file = self.path / fmt.MANIFEST_FILE
        stored = set(pq.read_schema(file).names)
        wanted = list(fmt.COLUMNS) if columns is None else list(columns)
        table = pq.read_table(file, columns=[c for c in wanted if c in stored])
        frame = table.to_pandas()
        if any(c not in stored for c in wanted):
            frame = fmt.fill_defaults(frame).loc[:, wanted]
        for name in fmt.LIST_COLUMNS:
            if name in frame.columns:
                frame[name] = [list(v) for v in frame[name].tolist()]
        return frame

    def image_file(self, image_path: str) -> Path:
        """The absolute file of a relative image path, refusing paths that escape the folder."""
        why = fmt.path_escape_problem(image_path) if image_path else "is empty"
        root = self.path.resolve()
        file = (root / image_path).resolve() if why is None else root
        if why is None and not file.is_relative_to(root):
            why = "resolves outside the benchmark folder"
        if why is not None:
            raise BenchmarkInvalid(self.id, [f"image path {image_path!r} {why}"])
        return file

    def read_image(self, image_path: str) -> bytes:
        """The encoded bytes of an image named by its manifest ``image_path``."""
        file = self.image_file(image_path)
        try:
            return file.read_bytes()
        except (FileNotFoundError, IsADirectoryError):
            raise BenchmarkNotFound(
                f"image {image_path!r} not found in benchmark {self.id!r}"
            ) from None


def default_root() -> Path:
    """Where built benchmarks live: ``$VIGIL_DATA_DIR/benchmarks`` (``var/benchmarks``)."""
    return Path(os.environ.get("VIGIL_DATA_DIR", "var")) / "benchmarks"


def _load(folder: Path) -> Benchmark:
    """Open a folder with the cheap checks: benchmark.json parses and the manifest exists."""
    meta_path = folder / fmt.META_FILE
    problems: list[str] = []
    data: Any = None
    if not meta_path.is_file():
        problems.append(f"{fmt.META_FILE}: missing")
    else:
        try:
            data = json.loads(meta_path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            problems.append(f"{fmt.META_FILE}: not valid JSON ({exc})")
        else:
            problems.extend(meta_problems(data))
    if not (folder / fmt.MANIFEST_FILE).is_file():
        problems.append(f"{fmt.MANIFEST_FILE}: missing")
    if problems:
        raise BenchmarkInvalid(str(folder), problems)
    return Benchmark(path=folder, meta=BenchmarkMeta.from_json(data))


def _candidates(root: Path) -> list[Path]:
    if not root.is_dir():
        return []
    return sorted(
        p
        for p in root.iterdir()
        if p.is_dir() and not p.name.startswith(".") and (p / fmt.META_FILE).is_file()
    )


def list_benchmarks(root: Path) -> list[Benchmark]:
    """Every readable benchmark under ``root``, sorted by name then id (broken folders and
    unfinished ``.tmp-*`` folders are skipped)."""
    found = []
    for folder in _candidates(Path(root)):
        try:
            found.append(_load(folder))
        except BenchmarkInvalid:
            continue
    return sorted(found, key=lambda b: (b.meta.name, b.id))


def _newest(benchmarks: list[Benchmark]) -> Benchmark:
    return max(benchmarks, key=lambda b: ((b.path / fmt.META_FILE).stat().st_mtime_ns, b.id))


def open_benchmark(ref: str | Path, root: Path) -> Benchmark:
    """Open a benchmark by folder path, by id (a folder name under ``root``) or by name (the
    newest benchmark under ``root`` with that name).

    Raises BenchmarkNotFound naming ``ref`` and what exists, or BenchmarkInvalid when the folder
    exists but its benchmark.json or manifest is missing or broken. Full checks are
    :func:`benchmark.validate.validate_benchmark`.
    """
    root = Path(root)
    text = str(ref)
    is_bare_name = not isinstance(ref, Path) and "/" not in text and os.sep not in text
    if is_bare_name and text not in ("", ".", "..") and (root / text).is_dir():
        return _load(root / text)
    if text and Path(ref).is_dir():
        return _load(Path(ref))
    available = list_benchmarks(root)
    named = [b for b in available if b.meta.name == text]
    if named:
        return _newest(named)
    if available:
        listing = ", ".join(b.id for b in available)
        raise BenchmarkNotFound(f"benchmark {text!r} not found under {root}; available: {listing}")
    raise BenchmarkNotFound(f"benchmark {text!r} not found; {root} holds no benchmarks")


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_file(path: Path, data: bytes, sync: bool = True) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        if sync:
            os.fsync(f.fileno())


def _fsync_all(paths: list[Path]) -> None:
    """fsync many files; concurrent fsyncs share journal commits (one at a time is ~10x slower)."""
    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(_fsync_path, paths))


def write_benchmark(
    root: Path,
    name: str,
    suite: str,
    size: str,
    seed: int,
    manifest: pd.DataFrame,
    images: dict[str, bytes],
) -> Benchmark:
    """Validate and store a benchmark; returns it (or the identical one already stored).

    Nothing is written when validation fails (BenchmarkInvalid lists every problem). The folder is
    built under ``root/.tmp-*``, fsynced and renamed into place, so a reader never sees half of
    one; if a benchmark with the same id exists, the new copy is discarded.
    """
    from cli.version import VIGIL_VERSION

    problems = []
    name_problem = fmt.check_name(name)
    if name_problem is not None:
        problems.append(name_problem)
    problems.extend(validate_manifest(manifest, images))
    if problems:
        raise BenchmarkInvalid(name, problems)

    table = fmt.manifest_table(manifest)
    referenced = sorted({p for p in manifest["image_path"].tolist() if p})
    digests = {p: fmt.sha256_hex(images[p]) for p in referenced}
    digest = fmt.content_hash(table, digests)
    meta = BenchmarkMeta(
        format_version=fmt.FORMAT_VERSION,
        name=name,
        suite=suite,
        size=size,
        seed=int(seed),
        content_hash=digest,
        item_count=len(manifest),
        subject_count=int(manifest["subject_id"].nunique()),
        tasks={str(k): int(v) for k, v in sorted(Counter(manifest["task"]).items())},
        created_by=f"vigil {VIGIL_VERSION}",
    )

    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    target = root / fmt.benchmark_id(name, digest)
    if target.is_dir():
        return _load(target)

    tmp = Path(tempfile.mkdtemp(prefix=fmt.TMP_PREFIX, dir=root))
    try:
        (tmp / fmt.IMAGES_DIR).mkdir()
        for path in referenced:
            _write_file(tmp / path, images[path], sync=False)
        _fsync_all([tmp / path for path in referenced])
        _fsync_path(tmp / fmt.IMAGES_DIR)
        pq.write_table(table, tmp / fmt.MANIFEST_FILE, compression="zstd")
        _fsync_path(tmp / fmt.MANIFEST_FILE)
        _write_file(tmp / fmt.META_FILE, meta.to_json().encode("utf-8"))
        os.chmod(tmp, 0o755)
        _fsync_path(tmp)
        try:
            os.rename(tmp, target)
        except OSError:
            if not target.is_dir():
                raise
            shutil.rmtree(tmp, ignore_errors=True)  # another writer stored the same benchmark
            return _load(target)
        _fsync_path(root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return _load(target)


def ensure_builtin(
    root: Path, suite: str, size: str, seed: int = 0, progress: bool = True
) -> Benchmark:
    """The stored built-in benchmark for (suite, size, seed), building it if none exists."""
    from benchmark.suites import build_suite

    for bench in reversed(_by_age(list_benchmarks(Path(root)))):
        meta = bench.meta
        if (meta.suite, meta.size, meta.seed) == (suite, size, seed):
            return bench
    manifest, images = build_suite(suite, size, seed, progress=progress)
    return write_benchmark(root, f"{suite}-{size}", suite, size, seed, manifest, images)


def _by_age(benchmarks: list[Benchmark]) -> list[Benchmark]:
    return sorted(benchmarks, key=lambda b: ((b.path / fmt.META_FILE).stat().st_mtime_ns, b.id))
