"""The trainer's configuration: the mounted spec plus the env contract, parsed once.

Everything downstream reads these frozen dataclasses, never `os.environ`, so a
test or a benchmark can build a `TrainerConfig` directly with `config_for`.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from disttrain_api import checkpoint_access, validation
from disttrain_api import constants as C
from disttrain_api.model import JobSpec, SpecError, parse_spec

DEFAULT_RENDEZVOUS_TIMEOUT_S = 300.0
# Files the trainer writes into its run dir, which the local launcher reads.
SUMMARY_FILE = C.SUMMARY_FILENAME
FINISHED_FILE = "finished-rank{rank}.json"  # a rank that completed every step, before it exits


def finished_path(run_dir: Path, rank: int) -> Path:
    return run_dir / FINISHED_FILE.format(rank=rank)


class ConfigError(ValueError):
    """The config or the env contract is unusable; the message names the variable/field and the fix."""


MAX_NAMES = 6  # names a ConfigError lists per kind of problem; the count says how many there are


def listed(names: Sequence[str]) -> str:
    """The first MAX_NAMES of `names`, comma-separated, and how many more there are."""
    shown = ", ".join(names[:MAX_NAMES])
    return shown + (f", ... {len(names) - MAX_NAMES} more" if len(names) > MAX_NAMES else "")


class Fenced(RuntimeError):
    """A newer writer claimed the checkpoint directory (checkpoints/fence.py): this process belongs to a
    replaced gang. Defined here, beside ConfigError, because dist_env maps both to their exit codes."""


class ModeNotImplemented(ConfigError):
    def __init__(self, mode: str, *, implemented: tuple[str, ...]):
        super().__init__(
            f"mode {mode!r} is not implemented by this trainer yet (implemented: {', '.join(implemented)})"
        )


@dataclass(frozen=True, kw_only=True)
class TrainerConfig:
    spec: JobSpec
    job: str
    rank: int | None  # None: this process must spawn NPROC_PER_NODE local ranks
    world_size: int
    local_rank: int
    node_rank: int
    nproc_per_node: int
    master_addr: str
    master_port: int
    checkpoint_dir: Path  # <root>/<job>
    run_dir: Path
    metrics_port: int  # already offset by local_rank; 0 = off
    termination_log: Path | None
    device: str | None  # "cpu" | "cuda" | None (auto)
    restart_attempt: int = 0
    job_uid: str = ""  # the job's UID (operator pods); with restart_attempt it names a checkpoint writer
    namespace: str = "default"  # the job's namespace (a metrics label, part of spec.checkpoint.uri's prefix)
    role: str = ""  # DISTTRAIN_ROLE: federated and parameter-server pods' side (aggregator, client, ...)
    # Train on CPU when GPUs were asked for but none is visible (spec.workers.allowCPUFallback
    # or the operator's DISTTRAIN_ALLOW_CPU_FALLBACK); otherwise that is a config error.
    allow_cpu_fallback: bool = False
    # How long a rank waits for MASTER_ADDR to resolve and for the gang to join. Peer
    # pods may stay Pending for minutes; past this the rank exits FAILED and is retried.
    rendezvous_timeout_s: float = DEFAULT_RENDEZVOUS_TIMEOUT_S

    @property
    def writes_checkpoints(self) -> bool:
        """Whether this pod writes checkpoints or the export (disttrain_api.checkpoint_access): one that
        does not is given no write access to them (a read-only volume, no checkpoint credentials)."""
        return checkpoint_access.writes_checkpoints(self.spec.mode, self.role, self.node_rank)

    def for_local_rank(self, local_rank: int) -> TrainerConfig:
        """The config of local rank i in a pod that runs NPROC_PER_NODE processes."""
        base_port = self.metrics_port - self.local_rank if self.metrics_port else 0
        return TrainerConfig(
            **{
                **self.__dict__,
                "rank": self.node_rank * self.nproc_per_node + local_rank,
                "local_rank": local_rank,
                "metrics_port": base_port + local_rank if base_port else 0,
            }
        )


def load_spec(path: str | Path) -> JobSpec:
    try:
        raw = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ConfigError(
            f"{C.ENV_CONFIG}={path}: file not found; mount the job config there"
        ) from None
    except json.JSONDecodeError as e:
        raise ConfigError(
            f"{C.ENV_CONFIG}={path}: not JSON ({e}); it must be to_json(spec)"
        ) from None
    try:
        spec = parse_spec(raw)
    except SpecError as e:
        raise ConfigError(f"{path}: invalid spec: " + "; ".join(str(x) for x in e.errors)) from None
    _cross_validate(spec)
    return spec


def _cross_validate(spec: JobSpec) -> None:
    """The same cross-field rules `disttrain validate` and the operator apply."""
    errors = validation.validate_spec(spec)
    if errors:
        raise ConfigError("invalid spec: " + "; ".join(str(x) for x in errors))


def _int(env: Mapping[str, str], name: str, default: int | None = None) -> int:
    value = env.get(name)
    if value is None or value == "":
        if default is None:
            raise ConfigError(
                f"{name} is not set; the launcher (operator or `disttrain local`) must set it"
            )
        return default
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"{name}={value!r} must be an integer") from None


def _positive_float(env: Mapping[str, str], name: str, default: float) -> float:
    value = env.get(name)
    if value is None or value == "":
        return default
    try:
        parsed = float(value)
    except ValueError:
        parsed = -1.0
    if not parsed > 0:
        raise ConfigError(f"{name}={value!r} must be a positive number of seconds")
    return parsed


def _default_termination_log() -> Path | None:
    path = Path(C.DEFAULT_TERMINATION_LOG)
    # Only inside a pod is /dev/termination-log a writable file.
    return path if path.exists() and os.access(path, os.W_OK) else None


def load_config(environ: Mapping[str, str] | None = None) -> TrainerConfig:
    env = os.environ if environ is None else environ
    config_path = env.get(C.ENV_CONFIG)
    if not config_path:
        raise ConfigError(
            f"{C.ENV_CONFIG} is not set; point it at the job spec JSON (to_json(spec))"
        )
    spec = load_spec(config_path)
    nproc = _int(env, C.ENV_NPROC_PER_NODE, spec.workers.procs_per_worker)
    world = _int(env, C.ENV_WORLD_SIZE, spec.world_size)
    node_rank = _int(env, C.ENV_NODE_RANK, 0)
    rank = _int(env, C.ENV_RANK) if env.get(C.ENV_RANK) not in (None, "") else None
    local_rank = _int(env, C.ENV_LOCAL_RANK, 0 if rank is None else rank % nproc)
    if rank is not None and not 0 <= rank < world:
        raise ConfigError(f"{C.ENV_RANK}={rank} must be in [0, {C.ENV_WORLD_SIZE}={world})")
    if rank is None and (node_rank + 1) * nproc > world:
        raise ConfigError(
            f"{C.ENV_NODE_RANK}={node_rank} x {C.ENV_NPROC_PER_NODE}={nproc} exceeds {C.ENV_WORLD_SIZE}={world}"
        )
    job = env.get(C.ENV_JOB) or "job"
    root = Path(env.get(C.ENV_CHECKPOINT_DIR) or spec.checkpoint.path)
    run_dir = Path(env.get(C.ENV_RUN_DIR) or Path(tempfile.gettempdir()) / "disttrain" / job)
    base_port = _int(env, C.ENV_METRICS_PORT, spec.metrics.port)
    term = env.get(C.ENV_TERMINATION_LOG)
    device = env.get(C.ENV_DEVICE) or None
    if device not in (None, "cpu", "cuda"):
        raise ConfigError(f"{C.ENV_DEVICE}={device!r} must be cpu or cuda")
    return TrainerConfig(
        spec=spec,
        job=job,
        rank=rank,
        world_size=world,
        local_rank=local_rank,
        node_rank=node_rank,
        nproc_per_node=nproc,
        master_addr=env.get(C.ENV_MASTER_ADDR) or "127.0.0.1",
        master_port=_int(env, C.ENV_MASTER_PORT, C.DEFAULT_MASTER_PORT),
        checkpoint_dir=root / job,
        run_dir=run_dir,
        metrics_port=base_port + local_rank if base_port else 0,
        termination_log=Path(term) if term else _default_termination_log(),
        device=device,
        restart_attempt=_int(env, C.ENV_RESTART_ATTEMPT, 0),
        job_uid=env.get(C.ENV_JOB_UID) or "",
        namespace=env.get(C.ENV_NAMESPACE) or "default",
        role=env.get(C.ENV_ROLE) or "",
        allow_cpu_fallback=spec.workers.allow_cpu_fallback
        or (env.get(C.ENV_ALLOW_CPU_FALLBACK) or "").strip().lower() in ("1", "true", "yes", "on"),
        rendezvous_timeout_s=_positive_float(env, C.ENV_RENDEZVOUS_TIMEOUT, DEFAULT_RENDEZVOUS_TIMEOUT_S),
    )


def config_for(
    spec: JobSpec,
    *,
    job: str = "job",
    rank: int = 0,
    world_size: int = 1,
    run_dir: Path,
    checkpoint_root: Path,
    master_addr: str = "127.0.0.1",
    master_port: int = C.DEFAULT_MASTER_PORT,
    metrics_port: int = 0,
    device: str | None = "cpu",
) -> TrainerConfig:
    """A config without env variables: for tests and benchmarks in one process per rank."""
    return TrainerConfig(
        spec=spec,
        job=job,
        rank=rank,
        world_size=world_size,
        local_rank=rank,
        node_rank=0,
        nproc_per_node=world_size,
        master_addr=master_addr,
        master_port=master_port,
        checkpoint_dir=checkpoint_root / job,
        run_dir=run_dir,
        metrics_port=metrics_port,
        termination_log=None,
        device=device,
    )
