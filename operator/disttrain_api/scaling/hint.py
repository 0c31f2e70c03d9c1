"""The one-line hint for a job whose step waits on communication: the layout change the forecast
predicts helps most at the job's own size, and by how much. The operator puts it in status.hint
with an Event (ScalingHint) while the job runs and when its summary arrives; `disttrain local`
prints it.

While a job runs, two readings of rank 0 feed it: the exposed-communication fraction of its last
log interval (the `disttrain_comm_exposed_fraction` gauge, scraped with the progress) decides
whether a hint is due; the forecast inputs rank 0 publishes beside its metrics (the summary's
`scaling` block as measured so far, metric_names.FORECAST_INPUTS_PATH) say which change. When the
job has finished, its summary (status.result) holds both.

The decision (`running_hint`) is pure and has hysteresis: a hint appears at EXPOSED_HINT_FRACTION,
goes away only below HINT_CLEAR_FRACTION, and keeps its text while the same change stays the best
one, so a job hovering around the threshold, or whose figures move by a point between intervals,
gets one Event, not one per reconcile. A hint that went (the share fell below the clear threshold)
and comes back proposing the change the last Event named is written again without an Event
(`status.hintAnnounced`): on a loaded node the share of one interval swings by more than the gap
between the two thresholds, and a 30 s job once had four Events of the same change.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .forecast import best_alternative, forecast
from .inputs import InputError, measured_from_summary

# Below this share of the step spent waiting on communication, no layout change is worth a hint.
EXPOSED_HINT_FRACTION = 0.25
# A hint once given stays until the share falls below this: intervals of one job scatter by a few
# points (evaluation, checkpoints, a noisy neighbour), and a hint that came and went with each
# would be an Event per interval.
HINT_CLEAR_FRACTION = 0.20
# A forecast gain below this is within the model's error (the validation's 15 %, halved): no hint.
MIN_HINT_GAIN = 0.07
# The hint proposes what the run measured the costs of: its own data-parallel layout with another
# gradient compression (one field, training.gradientCompression; bytes from the measured
# gradients, the overlap and the link from the run). Layouts that add mechanisms the run did not
# exercise are left to `disttrain explain` and its notes: from a 2-rank DDP run of the digits MLP on
# CPU the forecast put tp2 at +57% and FSDP at +60% samples/s, and both measured about 3x slower
# (8,509 and 7,101 against 24,684 samples/s): per-layer hooks and collectives cost compute the
# model does not see without a run that had them.
HINT_FAMILIES = ("data", "data+fp16", "data+powersgd")
# The largest world size a published input may claim (the API's bound on replicas x procs per
# worker is far below): the forecast enumerates layouts of it.
MAX_WORLD = 1 << 16


@dataclass(frozen=True, kw_only=True)
class Proposal:
    """What the forecast says about a run at its own size (from `propose`)."""

    world_size: int  # the size the inputs say the run has (a pod's claim: compare with the job's)
    efficiency: float  # the run's own layout: forecast samples/s over world_size x one worker's
    change: str | None  # the faster layout, e.g. "dp8 powersgd"; None: none is worth a hint
    current: str  # the run's layout, e.g. "dp8"
    gain: float  # change's samples/s over the run's - 1 (0.0 without a change)


def propose(inputs: dict[str, Any] | None, *, world_size: int | None = None) -> Proposal | None:
    """The forecast at the run's own size from summary-shaped inputs (a finished job's summary, or
    what a running rank 0 publishes); None when they do not fit the model: a mode or layout the
    hint does not cover (only data-parallel DDP has a compression hook to change), or figures that
    do not hold together. The inputs come from a pod running the user's code: anything odd is no
    proposal rather than a wrong one. `world_size`: the job's, when known (the inputs must agree;
    it also bounds the layouts enumerated)."""
    if not isinstance(inputs, dict):
        return None
    try:
        m = measured_from_summary(inputs, source="forecast inputs")
        if world_size is not None and m.world_size != world_size:
            return None
        if (m.pp, m.tp, m.data_strategy) != (1, 1, "ddp") or not 1 <= m.world_size <= MAX_WORLD:
            return None
        fc = forecast(m, sizes=(1, m.world_size))
        alt = best_alternative(fc, HINT_FAMILIES)
        own = fc.points.get((m.world_size, "data"))
    except (InputError, ValueError, ArithmeticError, KeyError, TypeError, AttributeError):
        return None
    if alt is None:
        if own is None:
            return None
        return Proposal(world_size=m.world_size, efficiency=own.efficiency, change=None,
                        current=own.layout.describe(), gain=0.0)  # fmt: skip
    worth = alt.gain >= MIN_HINT_GAIN
    return Proposal(world_size=m.world_size, efficiency=alt.current.efficiency,
                    change=alt.best.layout.describe() if worth else None, current=alt.current.layout.describe(),
                    gain=alt.gain if worth else 0.0)  # fmt: skip


_PROPOSES, _FORECAST = " of the step: ", " forecast "  # around the change in a hint_text


def hint_text(exposed: float, p: Proposal) -> str:
    """`exposed communication 38% of the step: dp4 powersgd forecast +22% samples/s over dp4`."""
    return (f"exposed communication {exposed:.0%}{_PROPOSES}{p.change}{_FORECAST}{p.gain:+.0%} samples/s "
            f"over {p.current}")  # fmt: skip


def change_of(hint: str | None) -> str | None:
    """The change a hint_text proposes (`dp8 powersgd`), or None for no hint."""
    if hint is None or _PROPOSES not in hint or _FORECAST not in hint:
        return None
    return hint.split(_PROPOSES, 1)[1].split(_FORECAST, 1)[0]


def names_change(hint: str | None, change: str) -> bool:
    """Whether `hint` (a hint_text) proposes `change`."""
    return change_of(hint) == change


def running_hint(prev: str | None, *, exposed: float | None, proposal: Proposal | None, known: bool,
                 world_size: int, threshold: float = EXPOSED_HINT_FRACTION,
                 clear_below: float = HINT_CLEAR_FRACTION) -> str | None:  # fmt: skip
    """status.hint after one reading of a running job; `prev`: the hint in status now. A result
    other than `prev` is a change (the caller writes it, and emits one Event for a new text).

    `exposed`: the exposed-communication fraction of rank 0's last interval (None: not exported
    or no reading yet). `proposal`: propose() on rank 0's published inputs; `known`: whether those
    inputs were read at all (a failed fetch says nothing: the hint stays as it is).

      exposed None                             -> prev
      exposed < clear_below                    -> None (the job no longer waits on the link)
      no hint yet and exposed < threshold      -> None
      inputs not read                          -> prev
      no proposal for the job's world size,
      or no change worth a hint                -> None
      the hint already names the best change   -> prev (the same text: no new Event)
      otherwise                                -> a new text naming the best change
    """
    if exposed is None:
        return prev
    if exposed < clear_below or (prev is None and exposed < threshold):
        return None
    if not known:
        return prev
    if proposal is None or proposal.change is None or proposal.world_size != world_size:
        return None
    if names_change(prev, proposal.change):
        return prev
    return hint_text(exposed, proposal)


def scaling_hint(result: dict[str, Any] | None, *, world_size: int,
                 threshold: float = EXPOSED_HINT_FRACTION) -> str | None:  # fmt: skip
    """A finished job's hint from its summary (status.result), or None: communication below
    `threshold` over the whole run, a mode the forecast does not model, no faster layout, or a
    summary that does not hold together. The summary comes from a pod running the user's code:
    its world size must be the job's (`world_size`), which also bounds the layouts enumerated."""
    if not isinstance(result, dict):
        return None
    exposed = result.get("commExposedFraction")
    if not isinstance(exposed, int | float) or isinstance(exposed, bool) or exposed < threshold:
        return None
    p = propose(result, world_size=world_size)
    if p is None or p.change is None:
        return None
    return hint_text(float(exposed), p)
