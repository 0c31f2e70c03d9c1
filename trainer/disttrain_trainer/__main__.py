"""`python -m disttrain_trainer`: one worker process (or, without RANK, all local ranks of a pod).

Exit codes (disttrain_api.exitcodes): OK on success; CONFIG for a config that
fails the same way on every retry; FAILED for anything transient, which the
launcher or the operator retries; STOPPED after SIGTERM, with the step every rank
stopped at checkpointed (stop_request.py); FENCED when a newer gang claimed the
checkpoint directory (checkpoint_fence.py). The reason is one line on stderr.
"""

from __future__ import annotations

import sys
import traceback

from disttrain_api.exitcodes import CONFIG as EXIT_CONFIG
from disttrain_api.exitcodes import FAILED as EXIT_FAILED
from disttrain_api.exitcodes import FENCED as EXIT_FENCED
from disttrain_api.exitcodes import INTERRUPTED as EXIT_INTERRUPTED
from disttrain_api.exitcodes import OK as EXIT_OK
from disttrain_api.exitcodes import STOPPED as EXIT_STOPPED

from . import stop_request


def _keep_until_exit(error: BaseException) -> None:
    """The error's traceback holds the run's model: it must outlive the process group (dist_env)."""
    try:
        from .dist_env import keep_until_exit  # noqa: PLC0415
    except ImportError:
        return  # torch missing: no process group was ever created
    keep_until_exit(error)


def main() -> int:
    # First: as PID 1 in a container the trainer would never see SIGTERM without a handler.
    stop_request.install()
    try:
        return _main()
    except stop_request.StopRequested as e:
        _keep_until_exit(e)
        print(f"disttrain-trainer: stopped on request ({e})", file=sys.stderr, flush=True)
        return EXIT_STOPPED


def _main() -> int:
    try:
        from .checkpoint_fence import Fenced  # noqa: PLC0415
        from .config import ConfigError, load_config  # noqa: PLC0415
        from .parallel import ModeNotImplemented  # noqa: PLC0415
        from .train import check_supported, run  # noqa: PLC0415
    except ImportError as e:
        print(
            f"disttrain-trainer: missing dependency: {e} (install disttrain[trainer])",
            file=sys.stderr,
        )
        return EXIT_FAILED
    try:
        cfg = load_config()
        if cfg.spec.mode == "federated":  # aggregator or client process, by DISTTRAIN_ROLE
            from .federated import run as run_federated  # noqa: PLC0415

            run_federated(cfg)
            return EXIT_OK
        if cfg.spec.mode == "paramserver":  # server shard or worker process, by DISTTRAIN_ROLE
            from .paramserver import run as run_paramserver  # noqa: PLC0415

            run_paramserver(cfg)
            return EXIT_OK
        check_supported(cfg)
        if cfg.rank is None and cfg.nproc_per_node > 1:
            from .dist_env import spawn_local_ranks  # noqa: PLC0415

            # `run` is importable by name, so the spawned children can unpickle it.
            spawn_local_ranks(cfg, run)
        else:
            run(cfg if cfg.rank is not None else cfg.for_local_rank(0))
        return EXIT_OK
    except (ConfigError, ModeNotImplemented) as e:
        print(f"disttrain-trainer: {e}", file=sys.stderr)
        return EXIT_CONFIG
    except Fenced as e:
        _keep_until_exit(e)
        print(f"disttrain-trainer: fenced: {e}", file=sys.stderr)
        return EXIT_FENCED
    except KeyboardInterrupt as e:
        _keep_until_exit(e)
        print("disttrain-trainer: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as e:  # noqa: BLE001 - the one-line reason for the pod status; the traceback goes before it
        _keep_until_exit(e)
        traceback.print_exc()
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        print(f"disttrain-trainer: {type(e).__name__}: {msg}", file=sys.stderr)
        return EXIT_FAILED


if __name__ == "__main__":
    code = main()
    try:
        from .dist_env import exit_process  # noqa: PLC0415
    except ImportError:
        sys.exit(code)  # torch missing: no process group was ever created
    exit_process(code)
