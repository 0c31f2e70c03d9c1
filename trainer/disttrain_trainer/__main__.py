"""`python -m disttrain_trainer`: one worker process (or, without RANK, all local ranks of a pod).

The config is parsed once; the mode's entry (modes/__init__.py) runs it.

Exit codes (disttrain_api.exitcodes): OK on success; CONFIG for a config that
fails the same way on every retry; FAILED for anything transient, which the
launcher or the operator retries; STOPPED after SIGTERM, with the step every rank
stopped at checkpointed (process/stop_request.py); FENCED when a newer gang claimed
the checkpoint directory (checkpoints/fence.py). The reason is one line on stderr.
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

from .checkpoints import remote as remote_checkpoints
from .checkpoints.fence import Fenced
from .modes import entry_for
from .process import stop_request
from .process.config import ConfigError, load_config


def _keep_until_exit(error: BaseException) -> None:
    """The error's traceback holds the run's model: it must outlive the process group (dist_env)."""
    try:
        from .process.dist_env import keep_until_exit  # noqa: PLC0415 - torch
    except ImportError:
        return  # torch missing: no process group was ever created
    keep_until_exit(error)


def main() -> int:
    # First: as PID 1 in a container the trainer would never see SIGTERM without a handler.
    stop_request.install()
    try:
        code = _main()
    except stop_request.StopRequested as e:
        _keep_until_exit(e)
        print(f"disttrain-trainer: stopped on request ({e})", file=sys.stderr, flush=True)
        return EXIT_STOPPED
    if code != EXIT_OK and stop_request.raised_before_training():
        # The stop was raised into start-up code that turned it into another error (an import:
        # see stop_request): the reason printed above is the stop's, not a failure to retry.
        print("disttrain-trainer: stopped on request (SIGTERM before training started)", file=sys.stderr, flush=True)
        return EXIT_STOPPED
    return code


def _main() -> int:
    try:
        cfg = load_config()
        if cfg.writes_checkpoints:  # a pod that does not (a federated client) has no credentials for them
            remote_checkpoints.attach_spec(cfg.spec, namespace=cfg.namespace, job=cfg.job, root=cfg.checkpoint_dir)
        try:
            # The mode's package only: a federated client never loads the data loop's modules.
            entry = entry_for(cfg.spec)
        except ImportError as e:
            print(
                f"disttrain-trainer: missing dependency: {e} (install disttrain[trainer])",
                file=sys.stderr,
            )
            return EXIT_FAILED
        entry(cfg)
        return EXIT_OK
    except ConfigError as e:  # ModeNotImplemented too
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
        from .process.dist_env import exit_process  # noqa: PLC0415 - torch
    except ImportError:
        sys.exit(code)  # torch missing: no process group was ever created
    exit_process(code)
