"""``vigil reference-model train|evaluate``: train the reference VLM on a benchmark's train split,
and score a saved model on one split offline."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

DEFAULT_BENCHMARK = "brain-mri-small"


def default_model_dir() -> Path:
    """Where ``vigil up`` keeps the reference model: ``$VIGIL_DATA_DIR/models/reference-vlm``."""
    return Path(os.environ.get("VIGIL_DATA_DIR", "var")) / "models" / "reference-vlm"


def is_complete(path: Path) -> bool:
    """Whether ``path`` holds a saved reference model (weights, processor and card)."""
    names = ("config.json", "model.safetensors", "processor_config.json", "README.md")
    return all((Path(path) / name).is_file() for name in names)


def train_into(bench_ref: str | Path, out: Path, config: object | None = None, quiet: bool = False):
    """Train on the benchmark ``bench_ref`` and move the result into ``out`` atomically (built
    in a sibling temporary folder, then renamed), so ``out`` never holds half a model."""
    from benchmark.store import default_root, open_benchmark
    from model_servers.reference.train import TrainConfig, train_reference_model

    bench = open_benchmark(bench_ref, default_root())
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out} exists and is not empty; choose another --out or remove it")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        report = train_reference_model(
            bench,
            tmp,
            config if isinstance(config, TrainConfig) else None,
            progress=None if quiet else lambda m: print(m, file=sys.stderr, flush=True),
        )
        os.chmod(tmp, 0o755)  # mkdtemp makes it private; a model folder is readable like any
        if out.exists():
            out.rmdir()
        os.rename(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return report


def _train_handler(args: argparse.Namespace) -> int:
    from benchmark.errors import BenchmarkInvalid, BenchmarkNotFound
    from model_servers.reference.data import NoTrainItems
    from model_servers.reference.train import TrainConfig

    config = TrainConfig(seed=args.seed, minutes=args.minutes, torch_threads=args.threads)
    if args.steps is not None:
        answer = max(1, round(args.steps * 0.75))
        config = TrainConfig(
            seed=args.seed,
            minutes=args.minutes,
            torch_threads=args.threads,
            answer_steps=answer,
            confidence_steps=max(1, args.steps - answer),
        )
    out = args.out or default_model_dir()
    try:
        report = train_into(args.benchmark, out, config)
    except (NoTrainItems, BenchmarkNotFound, BenchmarkInvalid, FileExistsError) as exc:
        print(f"vigil reference-model train: error: {exc}", file=sys.stderr)
        return 2
    print(out)
    print(
        f"{report.answer_steps}+{report.confidence_steps} steps in {report.seconds:.0f} s; "
        "train accuracy " + ", ".join(f"{k} {v:.2f}" for k, v in report.train_accuracy.items())
    )
    return 0


def _evaluate_handler(args: argparse.Namespace) -> int:
    from benchmark.errors import BenchmarkInvalid, BenchmarkNotFound
    from benchmark.store import default_root, open_benchmark
    from model_servers.backends.base import BackendLoadError
    from model_servers.reference.evaluate import evaluate

    try:
        bench = open_benchmark(args.benchmark, default_root())
        result = evaluate(args.model or default_model_dir(), bench, args.split)
    except (BenchmarkNotFound, BenchmarkInvalid, BackendLoadError) as exc:
        print(f"vigil reference-model evaluate: error: {exc}", file=sys.stderr)
        return 2
    print(f"{result.items} {args.split} items of {bench.id}; {result.unparsed} unparsed")
    for task, accuracy in result.accuracy.items():
        print(f"  {task:14s} accuracy {accuracy:.3f}  (chance {result.chance[task]:.3f})")
    print(
        f"  mean stated confidence {result.mean_confidence:.1f}; "
        f"mean |stated - 100 p(answer)| {result.mean_confidence_gap:.1f}"
    )
    return 0


def add_reference_model_commands(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the ``vigil reference-model`` group: ``train``."""
    parser = commands.add_parser("reference-model", help="Vigil's trained reference VLM")
    sub = parser.add_subparsers(dest="reference_command", required=True)
    train = sub.add_parser(
        "train",
        help="train the reference VLM on a benchmark's train split (about 5 minutes on CPU)",
        description=(
            "Train a small LLaVA-architecture model on the benchmark's train subjects and save it "
            "in Hugging Face format; serve it with: vigil serve model --backend hf --model-path DIR"
        ),
    )
    train.add_argument(
        "--benchmark",
        default=DEFAULT_BENCHMARK,
        help=f"benchmark name, id or folder (default: {DEFAULT_BENCHMARK})",
    )
    train.add_argument(
        "--out", type=Path, help="folder to create (default: $VIGIL_DATA_DIR/models/reference-vlm)"
    )
    train.add_argument("--minutes", type=float, default=5.0, help="time limit (default: 5)")
    train.add_argument(
        "--steps", type=int, help="training steps in all (default: 700 answer + 250 confidence)"
    )
    train.add_argument("--seed", type=int, default=0, help="seed (default: 0)")
    train.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch CPU threads (default: 1, the fastest on a busy machine)",
    )
    train.set_defaults(handler=_train_handler)
    check = sub.add_parser(
        "evaluate",
        help="score a saved model on one split of a benchmark, offline (the audit is what counts)",
    )
    check.add_argument("--model", type=Path, help="model folder (default: the reference model)")
    check.add_argument(
        "--benchmark", default=DEFAULT_BENCHMARK, help="benchmark name, id or folder"
    )
    check.add_argument("--split", default="audit", help="split to score (default: audit)")
    check.set_defaults(handler=_evaluate_handler)
