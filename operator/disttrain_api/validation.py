"""Cross-field rules of a DistTrainJob: what an OpenAPI schema cannot express.

The model (model/) checks each field on its own (types, ranges, enums, patterns); this
module checks how fields fit together — degrees against the world size, batch
splits, mode-specific blocks, fault tolerance and sync (ft_rules.py), model shapes. Every error names the field path to
change and says what is wrong with the numbers involved, and all of them are
reported at once. The rules live by concern in layout_rules.py, data_rules.py, mode_block_rules.py,
compute_rules.py and pod_rules.py; this module runs them, and checks every size of the elastic range. The CLI
(`disttrain validate`) and the operator (which turns them into an `InvalidSpec` condition)
share `check_job` / `load_job`.

A rule whose inputs already failed schema parsing is skipped: its numbers would
be the defaults that replaced the wrong values, not what the user wrote.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from disttrain_api import (
    compute_rules,
    data_rules,
    ft_rules,
    layout_rules,
    mode_block_rules,
    object_store_rules,
    pod_rules,
)
from disttrain_api.model import DistTrainJob, FieldError, JobSpec, SpecError, parse_job_partial
from disttrain_api.rule_checker import Checker


def _elastic(spec: JobSpec, c: Checker) -> None:
    el = spec.elastic
    if el is None or not c.ok("spec.workers.replicas"):
        return
    replicas = spec.workers.replicas
    if c.ok("spec.elastic.minReplicas") and el.min_replicas > replicas:
        c.add("spec.elastic.minReplicas", f"{el.min_replicas} must be <= workers.replicas {replicas}")
    if c.ok("spec.elastic.maxReplicas") and el.max_replicas < replicas:
        c.add("spec.elastic.maxReplicas", f"{el.max_replicas} must be >= workers.replicas {replicas}")


def _elastic_sizes(spec: JobSpec, c: Checker) -> None:
    el = spec.elastic
    # Every size of the range must be a valid gang: the operator may shrink or grow to any
    # of them, and a size that breaks a rule would only fail once the trainer starts there.
    # Checked only when the spec is valid at its own size; otherwise every size repeats the
    # same complaint.
    if el is None or c.errors or not c.ok("spec.workers", "spec.elastic", "spec.parallelism", "spec.data",
                                           "spec.training", "spec.mode"):
        return
    broken = {n: errs for n, errs in elastic_sizes(spec).items() if errs}
    if not broken:
        return
    sizes = sorted(broken)
    valid = [n for n in range(el.min_replicas, el.max_replicas + 1) if n not in broken]
    details = "; ".join(f"at {n}: {broken[n][0].path}: {broken[n][0].message}" for n in sizes[:2])
    more = f"; and {len(sizes) - 2} more" if len(sizes) > 2 else ""
    fix = (f"valid: {_ranges(valid)}; set minReplicas and maxReplicas so that every size between them is valid"
           if valid else "no size in it is valid")
    c.add(
        "spec.elastic",
        f"the range [{el.min_replicas}, {el.max_replicas}] contains sizes that break the spec: "
        f"{_ranges(sizes)} ({details}{more}); {fix}, or change the fields named",
    )


def _ranges(values: list[int]) -> str:
    """[1, 2, 3, 5] -> '1-3, 5'."""
    parts: list[str] = []
    for v in values:
        if parts and parts[-1].split("-")[-1] == str(v - 1):
            parts[-1] = f"{parts[-1].split('-')[0]}-{v}"
        else:
            parts.append(str(v))
    return ", ".join(parts)


def _at_size(spec: JobSpec, replicas: int) -> JobSpec:
    return dataclasses.replace(spec, workers=dataclasses.replace(spec.workers, replicas=replicas))


def elastic_sizes(spec: JobSpec) -> dict[int, list[FieldError]]:
    """Cross-field errors of the spec at every gang size of its elastic range (an empty
    list = a valid size). Without `elastic`, only its own size."""
    el = spec.elastic
    sizes = range(el.min_replicas, el.max_replicas + 1) if el is not None else [spec.workers.replicas]
    return {n: _size_rules(_at_size(spec, n)) for n in sizes}


def valid_sizes(spec: JobSpec) -> list[int]:
    """The gang sizes (pods) the operator may run this job at, ascending."""
    return [n for n, errs in elastic_sizes(spec).items() if not errs]


def validate_spec(spec: JobSpec, *, skip: Iterable[FieldError] = ()) -> list[FieldError]:
    """Cross-field errors of a parsed spec, in a stable order.

    `skip`: schema errors already found; rules reading those fields are not run.
    """
    c = Checker(skip)
    _size_dependent(spec, c)
    layout_rules.strategies(spec, c)
    mode_block_rules.mode_blocks(spec, c)
    mode_block_rules.channel_security(spec, c)
    ft_rules.fault_tolerance(spec, c)
    ft_rules.sync(spec, c)
    _elastic(spec, c)
    layout_rules.devices(spec, c)
    compute_rules.compute(spec, c)
    data_rules.data(spec, c)
    object_store_rules.object_store(spec, c)
    layout_rules.model(spec, c)
    _elastic_sizes(spec, c)
    _pod(spec, c)
    return c.errors


def _pod(spec: JobSpec, c: Checker) -> None:
    """What the worker pods take from the spec (pod_rules.py): reserved mount paths, volume
    types, the workers.template allow-list."""
    if c.ok("spec.checkpoint.path", "spec.checkpoint.volume"):
        c.errors += pod_rules.checkpoint_errors(spec.checkpoint.path, spec.checkpoint.volume)
    if c.ok("spec.workers.template", "spec.checkpoint.path"):
        c.errors += pod_rules.template_errors(spec.workers.template, spec.checkpoint.path)


def _size_dependent(spec: JobSpec, c: Checker) -> None:
    """The rules whose numbers involve the world size (workers.replicas)."""
    fit = layout_rules.degrees(spec, c)
    layout_rules.mode_degrees(spec, c, fit)
    layout_rules.schedule(spec, c)
    layout_rules.batch(spec, c, fit)


def _size_rules(spec: JobSpec) -> list[FieldError]:
    c = Checker(())
    _size_dependent(spec, c)
    return c.errors


def validate_job(job: DistTrainJob) -> list[FieldError]:
    """Cross-field errors of a parsed job."""
    return validate_spec(job.spec)


def check_job(obj: Any) -> tuple[DistTrainJob, list[FieldError]]:
    """Schema and cross-field errors of a manifest, all at once, plus the best-effort job."""
    job, errors = parse_job_partial(obj)
    return job, errors + validate_spec(job.spec, skip=errors)


def load_job(obj: Any) -> DistTrainJob:
    """Parse and fully validate a manifest (a dict). Raises SpecError listing every problem."""
    job, errors = check_job(obj)
    if errors:
        raise SpecError(errors)
    return job
