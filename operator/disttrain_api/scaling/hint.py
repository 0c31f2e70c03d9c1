"""The one-line hint for a job whose step waits on communication: the layout change the forecast
predicts helps most at the job's own size, and by how much. The operator puts it in
status.hint with an Event (ScalingHint) when a job's summary arrives; `disttrain local` prints it.

The inputs are the trainer's summary (status.result): its `scaling` block is measured over the
whole run, so the hint comes with the result, not from a running job's scrape.
"""

from __future__ import annotations

from typing import Any

from .forecast import best_alternative, forecast
from .inputs import InputError, measured_from_summary

# Below this share of the step spent waiting on communication, no layout change is worth a hint.
EXPOSED_HINT_FRACTION = 0.25
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


def scaling_hint(result: dict[str, Any] | None, *, world_size: int,
                 threshold: float = EXPOSED_HINT_FRACTION) -> str | None:  # fmt: skip
    """`exposed communication 38% of the step: dp4 powersgd forecast +22% samples/s`, or None:
    communication below `threshold`, a mode the forecast does not model, no faster layout, or a
    summary that does not hold together. The summary comes from a pod running the user's code:
    its world size must be the job's (`world_size`), which also bounds the layouts enumerated."""
    if not isinstance(result, dict):
        return None
    exposed = result.get("commExposedFraction")
    if not isinstance(exposed, int | float) or isinstance(exposed, bool) or exposed < threshold:
        return None
    try:
        m = measured_from_summary(result, source="status.result")
        if m.world_size != world_size:
            return None
        if (m.pp, m.tp, m.data_strategy) != (1, 1, "ddp"):
            return None  # no compression hook to change: FSDP, pipeline and tensor layouts
        alt = best_alternative(forecast(m, sizes=(1, m.world_size)), HINT_FAMILIES)
    except (InputError, ValueError, ArithmeticError, KeyError, TypeError):
        return None  # figures that do not fit the model: no hint rather than a wrong one
    if alt is None or alt.gain < MIN_HINT_GAIN:
        return None
    return (f"exposed communication {exposed:.0%} of the step: {alt.best.layout.describe()} forecast "
            f"{alt.gain:+.0%} samples/s over {alt.current.layout.describe()}")  # fmt: skip
