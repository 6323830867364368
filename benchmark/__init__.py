"""Benchmarks: the immutable, content-addressed format Vigil replays, and the built-in suites.

- ``benchmark.format``: manifest schema, image naming, content hash (pure).
- ``benchmark.store``: open, list, write and build benchmarks (``open_benchmark``,
  ``list_benchmarks``, ``write_benchmark``, ``ensure_builtin``, ``default_root``).
- ``benchmark.validate``: ``validate_manifest`` and ``validate_benchmark`` (lists of problems).
- ``benchmark.prompts``: the table-driven prompt wording.
- ``benchmark.suites``: suite registry; ``brain_mri`` is the first suite.
- ``benchmark.cli``: the ``vigil benchmark`` command group.
"""
