"""The local run: prepare the run dir, start the gang, restart it on failure, report.

Gang semantics match the operator: when any process dies abnormally the whole
gang is stopped and started again with DISTTRAIN_RESTART_ATTEMPT + 1; the
trainer resumes from the newest checkpoint by itself. After
runPolicy.backoffLimit restarts the job fails with the reason. A process that
exits STOPPED (it got SIGTERM and checkpointed its step) is a disruption, a restart
not counted against backoffLimit, only when this launcher sent the SIGTERM
(Failure.disruption), as the operator counts one only for a pod that was being
deleted; exit 3 for any other reason counts like any failure. Stopping the
launcher (Ctrl-C, SIGTERM) sends the gang SIGTERM and waits up to
runPolicy.terminationGracePeriodSeconds for it to checkpoint and exit.
With spec.faultTolerance a failed replica is replaced alone while the others go on
(replicas.py), until fewer than minReplicas are left.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from disttrain_api import exitcodes
from disttrain_api import model as api
from disttrain_api import progress as job_progress
from disttrain_api.scaling.hint import scaling_hint

from disttrain_trainer.launcher import env as envmod
from disttrain_trainer.launcher import identity, replicas, report
from disttrain_trainer.launcher.forked_ranks import FORKSERVER_LOG, RankForker
from disttrain_trainer.launcher.gang import LOGS_DIR, PIDS_FILE, Failure, Gang
from disttrain_trainer.launcher.progress import (
    PROGRESS_FILE,
    JsonlTail,
    ProgressPrinter,
    ProgressRecord,
    metrics_path,
    read_jsonl,
)
from disttrain_trainer.process.config import FINISHED_FILE, finished_path
from disttrain_trainer.process.threads import THREADS_ENV

CONFIG_FILE = "config.json"
CHECKPOINTS_DIR = "checkpoints"
TERMINATION_LOG = "termination-log"
# The trainer exits CONFIG when it rejects the config: restarting cannot help,
# so the launcher fails at once (see disttrain_api.exitcodes).
EXIT_CONFIG = exitcodes.CONFIG
EXIT_FAILED = exitcodes.FAILED
EXIT_INTERRUPTED = exitcodes.INTERRUPTED
EXIT_STOPPED = exitcodes.STOPPED
# Files a previous run left that --fresh removes (nothing else in the dir is touched).
RUN_ARTIFACTS = (
    CHECKPOINTS_DIR,
    LOGS_DIR,
    PIDS_FILE,
    CONFIG_FILE,
    TERMINATION_LOG,
    report.SUMMARY_FILE,
    report.LOCAL_SUMMARY_FILE,
    report.PLOT_FILE,
)


def default_run_dir(job_name: str) -> Path:
    return Path("disttrain-runs") / job_name


@dataclass(frozen=True, kw_only=True)
class LocalOptions:
    run_dir: Path
    fresh: bool = False
    progress: bool = True
    metrics_port: int | None = None  # None: free ports; 0: off; N: rank r serves N + r
    python: str = field(default_factory=lambda: sys.executable)
    poll_interval_s: float = 0.2
    progress_interval_s: float = job_progress.PROGRESS_INTERVAL_S  # progress.json rewritten at most this often
    grace_s: float | None = None  # None: the job's runPolicy.terminationGracePeriodSeconds
    out: TextIO | None = None  # default sys.stdout
    err: TextIO | None = None  # default sys.stderr


@dataclass(frozen=True, kw_only=True)
class LocalResult:
    exit_code: int
    summary: report.LocalSummary


class _Terminated(Exception):
    """SIGTERM to the launcher: stop the gang like Ctrl-C does."""


def checkpoint_root(run_dir: Path) -> Path:
    return run_dir / CHECKPOINTS_DIR


def has_checkpoints(run_dir: Path, job: str) -> bool:
    job_dir = checkpoint_root(run_dir) / job
    # Hidden entries are the trainer's unfinished temp dirs (".tmp-*"), not checkpoints.
    return job_dir.is_dir() and any(not p.name.startswith(".") for p in job_dir.iterdir())


def clear_run_dir(run_dir: Path) -> None:
    for name in RUN_ARTIFACTS:
        path = run_dir / name
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
    for path in run_dir.glob("metrics-rank*.jsonl"):
        path.unlink()
    clear_finished(run_dir)


def clear_finished(run_dir: Path) -> None:
    for path in run_dir.glob(FINISHED_FILE.format(rank="*")):
        path.unlink()


def all_finished(run_dir: Path, world_size: int, attempt: int) -> bool:
    """Did every rank of this attempt complete its last step (the trainer's finished-rank files)?"""
    for rank in range(world_size):
        try:
            data = json.loads(finished_path(run_dir, rank).read_text())
        except (OSError, ValueError):
            return False
        if not isinstance(data, dict) or data.get("restartAttempt") != attempt:
            return False
    return True


def cuda_device_count() -> int:
    # Importing torch costs seconds; without the NVIDIA driver's device node there is no CUDA anyway.
    if not Path("/dev/nvidiactl").exists():
        return 0
    import torch  # noqa: PLC0415 - torch (seconds to import), only where a GPU may exist

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def run_local(job: api.DistTrainJob, options: LocalOptions) -> LocalResult:
    out = options.out or sys.stdout
    err = options.err or sys.stderr
    spec = job.spec
    name = job.metadata.name
    run_dir = options.run_dir.resolve()
    if options.fresh:
        clear_run_dir(run_dir)
    # The checkpoint root exists before the ranks start: their data cache lives in it (data/cache.py).
    checkpoint_root(run_dir).mkdir(parents=True, exist_ok=True)
    if has_checkpoints(run_dir, name):
        print(
            f"resuming from the checkpoints in {checkpoint_root(run_dir) / name} (--fresh starts over)",
            file=out,
        )

    base_env = dict(os.environ)
    extra_env, warnings = envmod.template_env(spec.workers.template)
    base_env.update(extra_env)
    threads = int(base_env.get(THREADS_ENV) or envmod.default_threads(spec.world_size))
    # First, while the launcher has no thread of its own: the forkserver imports torch meanwhile.
    forker = RankForker(log=run_dir / LOGS_DIR / FORKSERVER_LOG, threads=threads)
    config_path = run_dir / CONFIG_FILE
    config_path.write_text(json.dumps(api.to_json(spec), indent=2) + "\n")
    plan = envmod.plan_devices(
        gpus=spec.workers.resources.gpus,
        replicas=spec.workers.replicas,
        procs_per_worker=spec.workers.procs_per_worker,
        cuda_count=cuda_device_count(),
        user_device=os.environ.get(envmod.C.ENV_DEVICE),
    )
    if plan.warning:
        warnings.append(plan.warning)
    for w in warnings:
        print(f"warning: {w}", file=err)

    slots = envmod.gang_slots(spec.workers.replicas, spec.workers.procs_per_worker)
    rank0_log = metrics_path(run_dir, 0)
    history = read_jsonl(rank0_log)  # earlier runs' records: the plot covers the whole training
    tail = JsonlTail(rank0_log)
    tail.read_new()  # the progress bar shows only this run
    federated = spec.mode == "federated" and spec.federated is not None
    # A federated job counts rounds where the other modes count steps.
    total_steps = spec.federated.rounds if federated and spec.federated else spec.training.steps
    # Paramserver: one server process per shard joins the workers; nobody waits for a peer, so a
    # failed process (worker or shard) is replaced alone, never the gang.
    shards = spec.param_server.shards if spec.mode == "paramserver" and spec.param_server else 0
    # Fault-tolerant replicas: a failed one is replaced alone while the others go on (replicas.py).
    ft = spec.fault_tolerant
    printer = ProgressPrinter(out, total=total_steps) if options.progress else None
    # What the operator's status.progress would say.
    tracker = ProgressRecord(spec, run_dir / PROGRESS_FILE, interval_s=options.progress_interval_s)
    print(
        f"disttrain local: {name}: {spec.world_size} processes ({spec.workers.replicas} x "
        f"{spec.workers.procs_per_worker}) on {plan.device}, run dir {run_dir}",
        file=out,
    )

    started = time.monotonic()
    deadline = spec.run_policy.active_deadline_seconds
    grace_s = options.grace_s if options.grace_s is not None else float(spec.run_policy.termination_grace_period_seconds)
    restarts, attempt, disruptions = 0, 0, 0
    status, reason, code = "Failed", None, EXIT_FAILED
    gang: Gang | None = None
    records: list[dict[str, Any]] = []
    previous = _install_sigterm()
    try:
        while True:
            gang_env = envmod.GangEnv(
                job=name,
                world_size=spec.world_size,
                procs_per_worker=spec.workers.procs_per_worker,
                master_port=envmod.reserve_ports(1)[
                    0
                ],  # fresh each attempt: the old one may linger in TIME_WAIT
                config_path=config_path,
                run_dir=run_dir,
                checkpoint_dir=checkpoint_root(run_dir),
                termination_log=run_dir / TERMINATION_LOG,
                restart_attempt=attempt,
                device=plan,
                threads=threads,
            )
            ports = envmod.metrics_ports(options.metrics_port, spec.world_size + int(federated or ft) + shards)
            envs = [(s, envmod.process_env(base_env, gang_env, s, ports[s.rank])) for s in slots]
            # Federated: an aggregator process joins; a dead client is not restarted, the rounds
            # go on without it (the aggregator drops stragglers).
            optional: frozenset[int] = frozenset()
            if federated:
                envs = envmod.federated_envs(envs, server_port=envmod.reserve_ports(1)[0], metrics_port=ports[-1])
                optional = frozenset(s.rank for s in slots)
            if shards:
                envs = envmod.paramserver_envs(envs, server_ports=envmod.reserve_ports(shards),
                                               metrics_ports=ports[spec.world_size:])  # fmt: skip
            if federated or shards:
                envs = identity.provision(run_dir, spec, envs)
            if ft:
                envs = replicas.replica_envs(envs, procs=spec.workers.procs_per_worker,
                                             store_ports=envmod.reserve_ports(spec.workers.replicas),
                                             lighthouse_port=envmod.reserve_ports(1)[0], metrics_port=ports[-1])  # fmt: skip
            clear_finished(run_dir)
            if attempt:
                tracker.restarted()
            gang = Gang.start(
                command=envmod.trainer_command(options.python),
                envs=envs,
                run_dir=run_dir,
                attempt=attempt,
                forker=forker,
            )
            outcome: Failure | bool = False
            ft_set = replicas.ReplicaSet(spec, gang, run_dir) if ft else None
            if ft_set is not None:
                optional = ft_set.optional
            counts = replicas.Counts(restarts=restarts, disruptions=disruptions)
            noted: set[int] = set()
            stepped = False  # has this attempt logged a step yet
            while outcome is False:
                time.sleep(options.poll_interval_s)
                new = [r for r in tail.read_new() if "event" not in r]  # step records only
                records.extend(new)
                for record in new:
                    tracker.update(record)
                elapsed = time.monotonic() - started
                if printer and new:
                    printer.update(new[-1], elapsed_s=elapsed, restarts=restarts, progress=tracker.block)
                    stepped = True
                elif printer and not stepped:
                    printer.status(
                        f"starting {spec.world_size} processes (attempt {attempt}) ... {elapsed:.0f} s"
                    )
                outcome = gang.poll(optional)
                if ft_set is not None:
                    counts.restarts, counts.disruptions = restarts, disruptions
                    outcome = replicas.handle(ft_set, outcome, counts, note=lambda m: _note(printer, out, m))
                    restarts, disruptions = counts.restarts, counts.disruptions
                elif shards and isinstance(outcome, Failure) and outcome.disruption:
                    disruptions += 1
                    _note(printer, out, f"{outcome.reason}: stopped on request, replacing only that process "
                                        f"(disruption {disruptions}, not counted as a restart)")  # fmt: skip
                    gang.replace(outcome.rank)
                    outcome = False
                elif (shards and isinstance(outcome, Failure) and outcome.returncode != EXIT_CONFIG
                        and restarts < spec.run_policy.backoff_limit):  # fmt: skip
                    restarts += 1
                    _note(printer, out, f"{outcome.reason}{_unrequested_stop(outcome)}: replacing only that process "
                                        f"(restart {restarts}/{spec.run_policy.backoff_limit})")  # fmt: skip
                    gang.replace(outcome.rank)
                    outcome = False
                for lost in [f for r, f in gang.lost.items() if r not in noted]:
                    noted.add(lost.rank)
                    _note(printer, out, f"client process lost, the rounds go on without it: {lost.reason}")
                if outcome is False and deadline and time.monotonic() - started > deadline:
                    break
            records.extend(tail.read_new())
            if outcome is True:
                status, code = "Succeeded", 0
                gang.stop(grace_s)  # federated clients that outlived the aggregator
                break
            gang.stop(grace_s)
            if outcome is False:
                reason = f"DeadlineExceeded: runPolicy.activeDeadlineSeconds={deadline} passed"
                break
            if all_finished(run_dir, spec.world_size, attempt):
                # Training is complete and saved; restarting would only redo the ending.
                _note(printer, out, f"{outcome.reason} after every rank finished: not restarting")
                status, code = "Succeeded", 0
                break
            _note(printer, out, f"{outcome.reason}{_unrequested_stop(outcome)}  (log: {outcome.log})")
            if outcome.returncode == EXIT_CONFIG:
                reason, code = f"the trainer rejected the job: {outcome.reason}", EXIT_CONFIG
                break
            if outcome.disruption:
                disruptions += 1
                attempt += 1
                _note(printer, out, f"stopped on request: restarting the gang from the checkpoint of the step it "
                                    f"stopped at (disruption {disruptions}, not counted as a restart)")  # fmt: skip
                continue
            if restarts >= spec.run_policy.backoff_limit:
                reason = (
                    f"BackoffLimitExceeded: {restarts} restarts (runPolicy.backoffLimit="
                    f"{spec.run_policy.backoff_limit}); last failure: {outcome.reason}"
                )
                break
            restarts += 1
            attempt += 1
            _note(
                printer,
                out,
                f"restarting the gang from the newest checkpoint (restart {restarts}/{spec.run_policy.backoff_limit})",
            )
    except (KeyboardInterrupt, _Terminated):
        status, reason, code = "Interrupted", "stopped by the user", EXIT_INTERRUPTED
        if gang is not None:
            _note(printer, out, f"stopping the gang (it checkpoints its step; up to {grace_s:.0f} s) ...")
            gang.stop(grace_s)
            records.extend(r for r in tail.read_new() if "event" not in r)  # up to the step it stopped at
    finally:
        if previous is not _NOT_INSTALLED:
            signal.signal(signal.SIGTERM, previous)
        if printer:
            printer.finish()

    all_records = report.dedupe_by_step(history + records)
    trainer_summary = report.load_trainer_summary(run_dir) if status == "Succeeded" else None
    progress = tracker.finish(succeeded=status == "Succeeded", result=trainer_summary)
    plot = report.write_plot(
        all_records,
        run_dir / report.PLOT_FILE,
        title=f"{name}: {spec.mode}-parallel, world size {spec.world_size}",
        per_stage=report.per_stage_of(trainer_summary),
    )
    summary = report.build_summary(
        job=name,
        status=status,
        reason=reason,
        trainer=trainer_summary,
        records=all_records,
        total_steps=total_steps,
        wall_s=time.monotonic() - started,
        restarts=restarts,
        world_size=spec.world_size,
        device=plan.device,
        run_dir=run_dir,
        plot=plot,
    )
    report.write_summary(summary, run_dir)
    print(report.format_summary(summary), file=out)
    if progress is not None:
        print(f"  progress       {job_progress.describe(progress)} ({run_dir / PROGRESS_FILE})", file=out)
    if (hint := scaling_hint(trainer_summary, world_size=spec.world_size)) is not None:
        print(f"  hint           {hint} (disttrain explain {run_dir})", file=out)
    if code != 0:
        print(f"disttrain local: job {name} {status.lower()}: {reason}", file=err)
    return LocalResult(exit_code=code, summary=summary)


def _unrequested_stop(outcome: Failure) -> str:
    """Why an exit 3 counts as a failure here, where a user expects a disruption."""
    if outcome.returncode == EXIT_STOPPED and not outcome.disruption:
        return " (a stop disttrain local did not ask for: counted as a failure)"
    return ""


def _note(printer: ProgressPrinter | None, out: TextIO, message: str) -> None:
    if printer:
        printer.note(message)
    else:
        print(message, file=out, flush=True)


_NOT_INSTALLED = object()


def _install_sigterm() -> Any:
    if threading.current_thread() is not threading.main_thread():
        return _NOT_INSTALLED  # signal handlers can only be set from the main thread

    def handler(signum: int, frame: Any) -> None:
        raise _Terminated()

    return signal.signal(signal.SIGTERM, handler)
