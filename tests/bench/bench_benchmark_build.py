"""Timing the ``brain-mri`` ``paper`` build: 250 subjects, 4,050 slices, 85 controls.

Prints the build time (rendering, then writing with validation), the validation time of the
stored folder, the item, image and subject counts (per split, format and phrasing), the
tumour-positive slice count and the laterality labels of the slices, and the peak resident memory
of this process and of the worker processes it forked.

Run: ``.venv/bin/pytest tests/bench/bench_benchmark_build.py -q -s -m bench``.
"""

from __future__ import annotations

import os
import resource
import time

import pytest

from benchmark.store import write_benchmark
from benchmark.suites import anatomy, build_suite
from benchmark.validate import validate_benchmark


def _peak_mib(who: int) -> float:
    return resource.getrusage(who).ru_maxrss / 1024.0  # Linux reports KiB


@pytest.mark.bench
def test_build_paper(tmp_path):
    start = time.perf_counter()
    anatomy.load_atlas()
    loaded = time.perf_counter()
    manifest, images = build_suite("brain-mri", "paper", seed=0, progress=False)
    rendered = time.perf_counter()
    bench = write_benchmark(tmp_path, "brain-mri-paper", "brain-mri", "paper", 0, manifest, images)
    written = time.perf_counter()
    problems = validate_benchmark(bench.path)
    validated = time.perf_counter()

    brain = manifest[~manifest["is_control"]]
    slices = brain.drop_duplicates("image_path")
    positives = int((slices["tumor_voxels"] >= 25).sum())
    sides = slices["laterality"].value_counts().to_dict()
    splits = manifest["split"].value_counts().to_dict()
    variants = manifest.groupby(["format", "phrasing"]).size().to_dict()
    print()
    print(f"cpus                    {os.cpu_count()}")
    print(f"atlas load              {loaded - start:7.2f} s")
    print(f"render (build_suite)    {rendered - loaded:7.2f} s")
    print(f"validate + write        {written - rendered:7.2f} s")
    print(f"total build             {written - start:7.2f} s")
    print(f"validate stored folder  {validated - written:7.2f} s")
    print(f"items                   {len(manifest):7d}  {splits}")
    print(f"items per variant       {variants}")
    print(f"images (unique)         {len(images):7d}")
    print(f"slices / controls       {len(slices):7d} / {len(images) - len(slices)}")
    print(f"subjects                {manifest['subject_id'].nunique():7d}")
    print(f"tumour-positive slices  {positives:7d} of {len(slices)}")
    print(f"slice laterality        {sides}")
    print(f"peak RSS (this process) {_peak_mib(resource.RUSAGE_SELF):7.0f} MiB")
    print(f"peak RSS (workers)      {_peak_mib(resource.RUSAGE_CHILDREN):7.0f} MiB")
    print(f"id                      {bench.id}")
    assert problems == []
    assert len(slices) == 4050 and len(images) == 4050 + 85
    assert manifest["subject_id"].nunique() == 250 + 85
