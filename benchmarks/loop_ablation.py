"""One rank of the data-parallel trainer with one feature of its loop switched off, for
`vs_torchrun.py --per-step --ablate`: what each feature costs per step, measured by removing it.

    python benchmarks/loop_ablation.py FEATURE     # then exactly what `python -m disttrain_trainer` does

The switch is a patch of the trainer's own modules in this process, applied before the trainer
starts; nothing in the product has a switch for it (a feature a user could turn off would be a
feature to test). Each patch removes the feature's per-step work and nothing else:

  metrics       Metrics(enabled=False): no Prometheus series, no JSON lines, no step histogram,
                and (as the loop does without metrics) no reading of DDP's communication timer
  comm-timer    metrics on, DDP's reducer timer never switched on nor read (no CommClock): DDP
                keeps torch's default runtime-logging sample rate
  step-records  the per-step record and its fold into the interval's tally and the step-time
                histogram (the interval's figures are then empty)
  data          every step trains on the rank's first batch again: no sampler, no shard read,
                no numpy -> tensor conversion (and the same values every step, which alone makes
                the step faster: benchmarks/README.md, "Where the gap is")
  gc            Python's automatic garbage collector left on as the interpreter has it (no
                freeze, no disable, no collection every COLLECT_EVERY_STEPS steps)
  scheduler     the learning rate stays where the scheduler put it at the start: no
                scheduler.step() per step
  stop-check    no per-step check for an agreed stop request
  census        no wrapper around the step that profiles the census step's collectives

and the control, `none`: nothing switched off, the trainer started through this script like the
others, so that what the launch path or the rounds' noise alone moves is measured beside them.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable
from typing import Any

FEATURES = ("metrics", "comm-timer", "step-records", "data", "gc", "scheduler", "stop-check", "census")
CONTROL = "none"


class _NoGC(contextlib.AbstractContextManager["_NoGC"]):
    def after_step(self, step: int) -> None:
        pass

    def __exit__(self, *exc: object) -> None:
        return None


class _FixedLR:
    """The run's scheduler with its per-step `step()` removed (state and LR as they were)."""

    def __init__(self, scheduler: Any) -> None:
        self._s = scheduler

    def step(self) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        return getattr(self._s, name)


def _replace(owner: Any, name: str, value: Any) -> None:
    """owner.name = value; a name the trainer no longer has fails here instead of switching nothing off."""
    if not hasattr(owner, name):
        raise SystemExit(f"loop_ablation: {getattr(owner, '__name__', owner)} has no {name!r}: update this script")
    setattr(owner, name, value)


def _around_train(attr: str, replacement: Callable[[Any], Any]) -> None:
    """Just before the data loop starts, run.attr = replacement(run.attr)."""
    from disttrain_trainer.modes.data import entry

    train = entry.train

    def patched(run: Any) -> Any:
        if not hasattr(run, attr):
            raise SystemExit(f"loop_ablation: the trainer's Run has no {attr!r}: update this script")
        setattr(run, attr, replacement(getattr(run, attr)))
        return train(run)

    _replace(entry, "train", patched)


def switch_off(feature: str) -> None:
    from disttrain_trainer.modes.data import layouts, loop
    from disttrain_trainer.telemetry import scaling_record, step_metrics

    if feature == CONTROL:
        return
    if feature == "metrics":
        init = step_metrics.Metrics.__init__

        def disabled(self: Any, **kwargs: Any) -> None:
            init(self, **{**kwargs, "enabled": False})

        _replace(step_metrics.Metrics, "__init__", disabled)
    elif feature == "comm-timer":
        _replace(layouts, "comm_clock_for", lambda model: None)
    elif feature == "step-records":
        _replace(loop, "fold_steps", lambda records, tally, metrics: records.clear())
    elif feature == "data":
        batch = loop._batch
        first: dict[int, Any] = {}

        def same_batch(run: Any) -> Any:
            if id(run) not in first:
                first[id(run)] = batch(run)
            return first[id(run)]

        _replace(loop, "_batch", same_batch)
    elif feature == "gc":
        _replace(loop, "LoopGC", _NoGC)
    elif feature == "scheduler":
        _around_train("scheduler", _FixedLR)
    elif feature == "stop-check":
        _around_train("stop", lambda stop: None)
    elif feature == "census":
        _replace(scaling_record.ScalingRecorder, "with_census", lambda self, step_fn, model: step_fn)
    else:
        raise SystemExit(f"loop_ablation: unknown feature {feature!r}; one of {', '.join(FEATURES)}")


def main() -> int:
    if len(sys.argv) != 2:
        raise SystemExit(f"usage: loop_ablation.py FEATURE (one of {', '.join(FEATURES)}, or {CONTROL})")
    switch_off(sys.argv[1])
    from disttrain_trainer.__main__ import main as trainer_main

    return trainer_main()


if __name__ == "__main__":
    sys.exit(main())
