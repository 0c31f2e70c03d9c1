"""Names of the Prometheus series that cross the trainer/operator boundary.

The trainer exports them (trainer `metrics.py`), the operator scrapes rank 0 for
progress, and the dashboards query them: one definition for all three.
"""

from __future__ import annotations

PREFIX = "disttrain_"

STEP = PREFIX + "step"
LAST_CHECKPOINT_STEP = PREFIX + "last_checkpoint_step"

# Series the operator reads from rank 0's /metrics for status.step / status.lastCheckpointStep.
PROGRESS_SERIES = (STEP, LAST_CHECKPOINT_STEP)
