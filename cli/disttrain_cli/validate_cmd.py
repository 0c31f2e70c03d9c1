"""`disttrain validate FILE...`: check DistTrainJob manifests without a cluster.

Every problem of every document is listed as `FILE[:doc N]: path: message`
(schema and cross-field rules together, see disttrain_api/validation.py); YAML syntax
errors as `FILE:LINE:COLUMN: YAML syntax error: ...`. Exit 0 when everything is
valid, 2 otherwise. A valid job that will probably not do what its author wants (checkpoints on
an emptyDir, which die with the pod) gets `FILE: warning: path: message` on stderr, exit 0.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import yaml
from disttrain_api import checkpoint_storage
from disttrain_api.exitcodes import CONFIG as EXIT_INVALID
from disttrain_api.model import GROUP, KIND
from disttrain_api.validation import check_job


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = subparsers.add_parser(
        "validate",
        help="check DistTrainJob manifests (schema and cross-field rules)",
        description="Check DistTrainJob manifests against the API's schema and cross-field rules. "
        "Multi-document files are supported; documents of other kinds are skipped. "
        "Exit 0 when every job is valid, 2 with every problem listed as FILE[:doc N]: path: message.",
    )
    p.add_argument("files", nargs="+", metavar="FILE", help="manifest file(s); - reads standard input")
    p.add_argument("-q", "--quiet", action="store_true", help="print problems only, not the valid jobs")
    p.set_defaults(handler=run)


def _loader() -> type:
    class StrictLoader(yaml.SafeLoader):
        """SafeLoader that rejects duplicate keys (PyYAML silently keeps the last one,
        which would hide a mistake the API server's strict decoding reports)."""

    def construct_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode, deep: bool = False) -> Any:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = loader.construct_object(key_node, deep=True)  # type: ignore[no-untyped-call]
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark
                )
            seen.add(key)
        return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)

    StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, construct_mapping)
    return StrictLoader


def _is_other_kind(doc: Any) -> bool:
    if not isinstance(doc, dict) or "kind" not in doc or doc.get("kind") == KIND:
        return False
    return not str(doc.get("apiVersion", "")).startswith(GROUP + "/")


def _summary(job: Any) -> str:
    s = job.spec
    par = s.parallelism
    if s.world_size % (par.tensor * par.pipeline) == 0:
        layout = f"world size {s.world_size} = tensor {par.tensor} x pipeline {par.pipeline} x data {s.data_degree}"
    else:  # pragma: no cover - only reached for valid jobs, where the degrees fit
        layout = f"world size {s.world_size}"
    return f"valid (DistTrainJob {job.metadata.name}: mode {s.mode}, {layout})"


def validate_text(text: str, name: str, out: list[str], problems: list[str], warnings: list[str] | None = None
                  ) -> None:  # fmt: skip
    """Validate one file's text; append OK lines to `out`, problem lines to `problems`, and
    what is valid but probably not meant (checkpoint_storage.warnings) to `warnings` (to `out`
    when None)."""
    try:
        docs = list(yaml.load_all(text, Loader=_loader()))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        where = f"{name}:{mark.line + 1}:{mark.column + 1}" if mark is not None else name
        problem = getattr(exc, "problem", None) or str(exc)
        context = getattr(exc, "context", None)
        problems.append(f"{where}: YAML syntax error: {problem}" + (f" ({context})" if context else ""))
        return
    multi = len(docs) > 1
    jobs = 0
    for index, doc in enumerate(docs, start=1):
        label = f"{name}:doc {index}" if multi else name
        if doc is None:
            continue  # an empty document, e.g. after a trailing '---'
        if _is_other_kind(doc):
            out.append(f"{label}: skipped ({doc.get('kind')} is not a DistTrainJob)")
            continue
        jobs += 1
        job, errors = check_job(doc)
        if errors:
            problems.extend(f"{label}: {e.path}: {e.message}" for e in errors)
        else:
            out.append(f"{label}: {_summary(job)}")
            notes = [f"{label}: warning: {w.path}: {w.message}" for w in checkpoint_storage.warnings(job.spec)]
            (out if warnings is None else warnings).extend(notes)
    if jobs == 0:
        problems.append(f"{name}: no DistTrainJob document found")


def job_documents(text: str) -> list[dict[str, Any]]:
    """The DistTrainJob documents of a text `validate_text` found valid."""
    return [d for d in yaml.load_all(text, Loader=_loader()) if isinstance(d, dict) and not _is_other_kind(d)]


def run(args: argparse.Namespace) -> int:
    total_problems = 0
    bad_files = 0
    for name in args.files:
        out: list[str] = []
        problems: list[str] = []
        warnings: list[str] = []
        try:
            text = sys.stdin.read() if name == "-" else open(name, encoding="utf-8").read()
        except (OSError, UnicodeDecodeError) as exc:
            problems.append(f"{name}: cannot read: {getattr(exc, 'strerror', None) or exc}")
        else:
            validate_text(text, "<stdin>" if name == "-" else name, out, problems, warnings)
        if not args.quiet:
            for line in out:
                print(line)
        for line in warnings:  # valid (exit 0), but said even with --quiet
            print(line, file=sys.stderr)
        for line in problems:
            print(line, file=sys.stderr)
        total_problems += len(problems)
        bad_files += bool(problems)
    if total_problems:
        plural = "s" if total_problems != 1 else ""
        print(
            f"disttrain validate: {total_problems} problem{plural} in {bad_files} of {len(args.files)} file(s)",
            file=sys.stderr,
        )
        return EXIT_INVALID
    return 0
