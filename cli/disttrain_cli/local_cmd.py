"""`disttrain local FILE`: run a DistTrainJob on this machine, as the operator would in a cluster.

The launcher itself lives in the trainer package (`disttrain_trainer.launcher`)
because it needs the trainer's dependencies; this module only parses
arguments and the manifest, so `disttrain local --help` stays fast.
"""

from __future__ import annotations

import argparse
import dataclasses
import faulthandler
import signal
import sys
from pathlib import Path
from typing import Any

import yaml
from disttrain_api import constants as C
from disttrain_api.dataparse import Object
from disttrain_api.exitcodes import CONFIG as EXIT_INVALID
from disttrain_api.model import HF_MODEL_PREFIX
from disttrain_api.validation import load_job

from . import validate_cmd


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = subparsers.add_parser(
        "local",
        help="run a DistTrainJob on this machine (replicas x procsPerWorker local processes)",
        description=(
            "Run the job in FILE on this machine with the same env contract as the operator: "
            "replicas x procsPerWorker trainer processes (CPU/gloo without CUDA), a live progress "
            "bar, gang restart from the newest checkpoint up to runPolicy.backoffLimit, and a final "
            "summary plus a PNG of loss and compute/communication/data time in the run dir."
        ),
    )
    p.add_argument("file", metavar="FILE", help="DistTrainJob manifest (YAML)")
    p.add_argument(
        "--run-dir",
        type=Path,
        default=None,
        help="where config, checkpoints, logs, metrics and the plot go (default: ./disttrain-runs/<job-name>/); "
        "an existing run dir with checkpoints resumes",
    )
    p.add_argument(
        "--fresh", action="store_true", help="delete the run dir's checkpoints and logs first"
    )
    p.add_argument(
        "--no-progress", action="store_true", help="no progress bar (the summary is still printed)"
    )
    p.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        metavar="PORT",
        help="rank r serves Prometheus /metrics on PORT + r; 0 turns it off (default: free ports)",
    )
    p.add_argument(
        "--progress-interval",
        type=float,
        default=None,
        metavar="SECONDS",
        help="rewrite the run dir's progress.json at most this often (default 10, like the operator's status)",
    )
    p.set_defaults(handler=run)


def load_manifest(path: str) -> tuple[Any, list[str]]:
    """(the one DistTrainJob in `path`, []) or (None, problems formatted as `disttrain validate` prints them)."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as exc:
        return None, [f"{path}: cannot read: {getattr(exc, 'strerror', None) or exc}"]
    out: list[str] = []
    problems: list[str] = []
    # The same checks and messages as `disttrain validate` (schema and cross-field rules).
    validate_cmd.validate_text(text, path, out, problems)
    if problems:
        return None, problems
    docs = [
        d
        for d in yaml.load_all(text, Loader=validate_cmd._loader())
        if d is not None and not validate_cmd._is_other_kind(d)
    ]
    if len(docs) != 1:
        return None, [
            f"{path}: {len(docs)} DistTrainJob documents; disttrain local runs exactly one"
        ]
    return with_local_data(load_job(docs[0]), Path(path)), []


def with_local_data(job: Any, manifest: Path) -> Any:
    """A relative spec.data.path names a file beside the manifest here (in a pod: under the data
    volume's mount), so the same manifest runs on a laptop and in the cluster. No volume is
    mounted here: the files are read where they lie."""
    data, model = job.spec.data, job.spec.model

    def here(p: str) -> str:
        return p if Path(p).is_absolute() else str((manifest.parent / p).resolve())

    # An hf: model's directory and data.tokenizer resolve the same way (in a pod: under mountPath).
    if model.hf_dir:
        model = dataclasses.replace(model, name=HF_MODEL_PREFIX + here(model.hf_dir))
    if data.tokenizer:
        data = dataclasses.replace(data, tokenizer=here(data.tokenizer))
    if data.path and not data.path.startswith(C.OBJECT_STORE_SCHEME):  # an s3:// URI reads the same anywhere
        data = dataclasses.replace(data, path=here(data.path), volume=Object())
    return dataclasses.replace(job, spec=dataclasses.replace(job.spec, data=data, model=model))


def run(args: argparse.Namespace) -> int:
    job, problems = load_manifest(args.file)
    if job is None:
        for line in problems:
            print(line, file=sys.stderr)
        print(
            f"disttrain local: {args.file} is not a runnable DistTrainJob; nothing was started",
            file=sys.stderr,
        )
        return EXIT_INVALID
    if args.metrics_port is not None and not (
        args.metrics_port == 0 or 1024 <= args.metrics_port <= 65535
    ):
        print(
            f"--metrics-port {args.metrics_port}: use 0 (off) or a port in 1024..65535",
            file=sys.stderr,
        )
        return EXIT_INVALID
    if args.progress_interval is not None and not args.progress_interval > 0:
        print(f"--progress-interval {args.progress_interval}: use a positive number of seconds", file=sys.stderr)
        return EXIT_INVALID

    # The trainer package: only `disttrain local` loads it (its processes need the trainer extra).
    from disttrain_trainer.launcher import LocalOptions, run_local  # noqa: PLC0415 - disttrain_trainer
    from disttrain_trainer.launcher.run import default_run_dir  # noqa: PLC0415 - disttrain_trainer

    # `kill -USR1 <pid>` prints where the launcher is (every thread's Python stack) to stderr.
    faulthandler.register(signal.SIGUSR1, all_threads=True)

    options = LocalOptions(
        run_dir=args.run_dir or default_run_dir(job.metadata.name),
        fresh=args.fresh,
        progress=not args.no_progress,
        metrics_port=args.metrics_port,
        **({"progress_interval_s": args.progress_interval} if args.progress_interval is not None else {}),
    )
    return run_local(job, options).exit_code
