"""Names of the Prometheus series the trainer exports.

The trainer exports them (trainer `metrics.py`), the operator scrapes rank 0 for
progress, and the dashboards query them: one definition for all three.

Every step's wall time splits into data + compute + exposed communication + idle
(+ the bookkeeping between steps). Busy communication overlaps compute and is
reported beside the split, never added into it:

  comm busy    = a gradient collective is in flight (from the launch of the first
                 bucket's all-reduce to the completion of the last), overlapped or not;
  comm exposed = the step waits on communication that no compute overlaps (from the
                 end of backward compute to the last collective's completion);
  idle         = this rank waits while rank 0 works alone (evaluation, checkpoint snapshot).
"""

from __future__ import annotations

PREFIX = "disttrain_"

STEP = PREFIX + "step"
LAST_CHECKPOINT_STEP = PREFIX + "last_checkpoint_step"

# Series the operator reads from rank 0's /metrics for status.step / status.lastCheckpointStep.
PROGRESS_SERIES = (STEP, LAST_CHECKPOINT_STEP)

STEP_SECONDS = PREFIX + "step_seconds"  # histogram of step wall time

# Counters (prometheus_client appends _total).
COMPUTE_SECONDS = PREFIX + "compute_seconds"
DATA_SECONDS = PREFIX + "data_seconds"
IDLE_SECONDS = PREFIX + "idle_seconds"
COMM_EXPOSED_SECONDS = PREFIX + "comm_exposed_seconds"
COMM_BUSY_SECONDS = PREFIX + "comm_busy_seconds"
GRADIENT_BYTES = PREFIX + "gradient_bytes"
SAMPLES = PREFIX + "samples"
CHECKPOINTS = PREFIX + "checkpoints"

# Gauges: the mean per step over the last log interval.
STEP_COMPUTE_SECONDS = PREFIX + "step_compute_seconds"
STEP_DATA_SECONDS = PREFIX + "step_data_seconds"
STEP_IDLE_SECONDS = PREFIX + "step_idle_seconds"
STEP_COMM_EXPOSED_SECONDS = PREFIX + "step_comm_exposed_seconds"
STEP_COMM_BUSY_SECONDS = PREFIX + "step_comm_busy_seconds"
# Gauges: seconds / step seconds over the last log interval (exposed is the scaling problem's headline).
COMM_EXPOSED_FRACTION = PREFIX + "comm_exposed_fraction"
COMM_BUSY_FRACTION = PREFIX + "comm_busy_fraction"
IDLE_FRACTION = PREFIX + "idle_fraction"

SAMPLES_PER_SECOND = PREFIX + "samples_per_second"
LOSS = PREFIX + "loss"
LEARNING_RATE = PREFIX + "learning_rate"
EVAL_METRIC = PREFIX + "eval_metric"

CHECKPOINT_STALL_SECONDS = PREFIX + "checkpoint_stall_seconds"  # the loop's pause for a snapshot
CHECKPOINT_WRITE_SECONDS = PREFIX + "checkpoint_write_seconds"  # the background write
CHECKPOINT_BYTES = PREFIX + "checkpoint_bytes"
