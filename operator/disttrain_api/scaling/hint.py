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
        alt = best_alternative(forecast(m, sizes=(1, m.world_size)))
    except (InputError, ValueError, ArithmeticError, KeyError, TypeError):
        return None  # figures that do not fit the model: no hint rather than a wrong one
    if alt is None or alt.gain < MIN_HINT_GAIN:
        return None
    return (f"exposed communication {exposed:.0%} of the step: {alt.best.layout.describe()} forecast "
            f"{alt.gain:+.0%} samples/s over {alt.current.layout.describe()}")  # fmt: skip
