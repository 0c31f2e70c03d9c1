"""Names of the Prometheus series and labels that cross the trainer/operator boundary.

The trainer exports them (trainer `telemetry/`), the operator scrapes rank 0 for
progress, and the dashboards (charts/disttrain/dashboards/) query them: one
definition for all three.

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
# The steps the job trains (spec.training.steps): the dashboard's progress and ETA divide by it.
TARGET_STEPS = PREFIX + "target_steps"
LAST_CHECKPOINT_STEP = PREFIX + "last_checkpoint_step"
# Histogram of step wall time: its _sum is the denominator of the communication fraction.
STEP_SECONDS = PREFIX + "step_seconds"
STEP_SECONDS_SUM = STEP_SECONDS + "_sum"
# Exposed communication, the time the step waits for (the numerator of the communication fraction).
COMM_EXPOSED_SECONDS = PREFIX + "comm_exposed_seconds"
COMM_SECONDS_TOTAL = COMM_EXPOSED_SECONDS + "_total"

# Model FLOPs utilisation over the last log interval, exported only where the trainer knows
# the accelerators' peak (a GPT on a known GPU: trainer telemetry/model_flops.py).
MFU = PREFIX + "mfu"

# Exposed communication / step time over the last log interval (a gauge): the running job's
# figure the operator's scaling hint is decided on (disttrain_api/scaling/hint.py).
COMM_EXPOSED_FRACTION = PREFIX + "comm_exposed_fraction"

# Seconds the run will still take after its last step (the final evaluation, the export, the final
# checkpoint), as rank 0 predicts them from what it measured so far (a gauge; trainer
# telemetry/finish_estimate.py): the ETA adds them (disttrain_api/progress.py).
FINISH_SECONDS = PREFIX + "finish_seconds"

# A fault-tolerant replica (spec.faultTolerance): the replicas in the quorum of its latest step and
# the lighthouse's id of that quorum (it changes with the quorum's members): status.replicaGroups.
FT_QUORUM_SIZE = PREFIX + "ft_quorum_replicas"
FT_QUORUM_ID = PREFIX + "ft_quorum_id"

# Series the operator reads from rank 0's /metrics for status.step / lastCheckpointStep /
# commFraction / progress / hint / replicaGroups.
PROGRESS_SERIES = (STEP, LAST_CHECKPOINT_STEP, COMM_SECONDS_TOTAL, STEP_SECONDS_SUM, MFU, COMM_EXPOSED_FRACTION,
                   FINISH_SECONDS, FT_QUORUM_SIZE, FT_QUORUM_ID)  # fmt: skip

# Beside /metrics, a data-parallel rank 0 serves the scaling forecast's inputs as measured so far
# (a JSON object shaped like its summary: mode, layout, worldSize, ..., scaling): the operator
# reads them for a running job's hint. 404 until the first steady-state interval.
FORECAST_INPUTS_PATH = "/forecast-inputs"
# Gauges rank 0 exports from the forecast on those inputs, at the run's own size: the scaling
# efficiency of its layout (samples/s over world size x one worker's), and the samples/s gain
# of the change the hint would name (0: none worth one).
FORECAST_EFFICIENCY = PREFIX + "forecast_efficiency"
FORECAST_GAIN = PREFIX + "forecast_hint_gain"

# Labels of every trainer series. Not `job`/`instance`: Prometheus attaches those to every
# scraped target, and a series' own `job` would be renamed `exported_job` (or, with
# honor_labels, would replace the scrape job). `namespace` equals the pod's namespace, so a
# scrape config or PodMonitor that adds a `namespace` target label agrees with it.
LABEL_JOB = "dtjob"
LABEL_NAMESPACE = "namespace"
LABEL_RANK = "rank"
LABEL_MODE = "mode"
SERIES_LABELS = (LABEL_JOB, LABEL_NAMESPACE, LABEL_RANK, LABEL_MODE)
# A target label the scrape config adds from the pod label disttrain.dev/restart-attempt (the
# chart's PodMonitor and README scrape config): the dashboard counts gang restarts with it.
LABEL_RESTART_ATTEMPT = "restart_attempt"


def comm_fraction(progress: dict[str, float]) -> float | None:
    """Communication seconds / step seconds from one scrape (None before the first step)."""
    comm, step = progress.get(COMM_SECONDS_TOTAL), progress.get(STEP_SECONDS_SUM)
    if comm is None or not step:
        return None
    return round(min(max(comm / step, 0.0), 1.0), 4)

# --- data-parallel trainer ----------------------------------------------------
# Counters (prometheus_client appends _total).
COMPUTE_SECONDS = PREFIX + "compute_seconds"
DATA_SECONDS = PREFIX + "data_seconds"
IDLE_SECONDS = PREFIX + "idle_seconds"
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
COMM_BUSY_FRACTION = PREFIX + "comm_busy_fraction"
IDLE_FRACTION = PREFIX + "idle_fraction"

SAMPLES_PER_SECOND = PREFIX + "samples_per_second"
LOSS = PREFIX + "loss"
LEARNING_RATE = PREFIX + "learning_rate"
EVAL_METRIC = PREFIX + "eval_metric"

CHECKPOINT_STALL_SECONDS = PREFIX + "checkpoint_stall_seconds"  # the loop's pause for a snapshot
CHECKPOINT_WRITE_SECONDS = PREFIX + "checkpoint_write_seconds"  # the background write
CHECKPOINT_BYTES = PREFIX + "checkpoint_bytes"

# --- fault-tolerant data parallel and LocalSGD / DiLoCo (spec.faultTolerance, training.sync) ---
# Trainer gauges and counters, per replica.
# FT_QUORUM_SIZE, FT_QUORUM_ID: with the progress series above.
FT_STEPS_DISCARDED = PREFIX + "ft_steps_discarded"  # step attempts not committed (a peer failed mid-step)
FT_RECOVERIES = PREFIX + "ft_recoveries"  # times this replica received the state of a live peer
FT_RECOVERY_SECONDS = PREFIX + "ft_recovery_seconds"  # how long the last such recovery took
# Bytes of parameters (localsgd) or pseudo-gradients (diloco) all-reduced by the outer synchronisations.
SYNC_BYTES = PREFIX + "sync_bytes"
# The operator's counters of fault-tolerant replicas: OPERATOR_FT_* below.

# --- federated mode (aggregator and client processes) -------------------------
FED_ROUND = PREFIX + "federated_round"
FED_ROUND_SECONDS = PREFIX + "federated_round_seconds"
FED_CLIENTS_SAMPLED = PREFIX + "federated_clients_sampled"
FED_CLIENTS_ANSWERED = PREFIX + "federated_clients_answered"
FED_CLIENTS_DROPPED = PREFIX + "federated_clients_dropped"
FED_UPDATES_REJECTED = PREFIX + "federated_updates_rejected"
FED_ROUND_RETRIES = PREFIX + "federated_round_retries"
FED_ROUNDS_ABANDONED = PREFIX + "federated_rounds_abandoned"
FED_PRIVACY_EPSILON = PREFIX + "federated_privacy_epsilon"
FED_BYTES_UP = PREFIX + "federated_bytes_up"
FED_BYTES_DOWN = PREFIX + "federated_bytes_down"
FED_ACCURACY = PREFIX + "federated_global_accuracy"
FED_CLIENT_COMPUTE_SECONDS = PREFIX + "federated_client_compute_seconds"
FED_CLIENT_COMM_SECONDS = PREFIX + "federated_client_communication_seconds"

# --- parameter-server mode (server shards and worker processes) ---------------
PS_VERSION = PREFIX + "paramserver_version"
PS_STALENESS = PREFIX + "paramserver_staleness"
PS_PUSHES_ACCEPTED = PREFIX + "paramserver_pushes_accepted"
PS_PUSHES_REJECTED = PREFIX + "paramserver_pushes_rejected"
PS_APPLY_SECONDS = PREFIX + "paramserver_apply_seconds"
PS_SERVER_PUSH_BYTES = PREFIX + "paramserver_server_push_bytes"
PS_SERVER_PULL_BYTES = PREFIX + "paramserver_server_pull_bytes"
PS_PUSH_SECONDS = PREFIX + "paramserver_push_seconds"
PS_PULL_SECONDS = PREFIX + "paramserver_pull_seconds"
PS_PUSH_BYTES = PREFIX + "paramserver_push_bytes"
PS_PULL_BYTES = PREFIX + "paramserver_pull_bytes"

# --- experiment tracking (spec.tracking) ----------------------------------------
# Counter (prometheus_client appends _total), label LABEL_TRACKING_BACKEND (tensorboard, mlflow):
# records the tracking process could not deliver (after its retries) or dropped (its queue was
# full); training never waits for them or fails with them.
TRACKING_ERRORS = PREFIX + "tracking_errors"
LABEL_TRACKING_BACKEND = "backend"
# --- pipeline stages (the stage's own registry; labels SERIES_LABELS + stage) --
PIPE_BUBBLE_SECONDS = PREFIX + "pipeline_bubble_seconds"  # counter
PIPE_P2P_SECONDS = PREFIX + "pipeline_p2p_seconds"  # counter
PIPE_BUBBLE_FRACTION = PREFIX + "pipeline_bubble_fraction"
PIPE_STEP_BUBBLE_SECONDS = PREFIX + "pipeline_step_bubble_seconds"
PIPE_STEP_P2P_SECONDS = PREFIX + "pipeline_step_p2p_seconds"
PIPE_STEP_ALLREDUCE_SECONDS = PREFIX + "pipeline_step_allreduce_seconds"
PIPE_ACTIVATION_PEAK_BYTES = PREFIX + "pipeline_activation_peak_bytes"
PIPE_PLAN_STAGE_SECONDS = PREFIX + "pipeline_plan_stage_seconds"  # labels SERIES_LABELS + plan_stage
PIPE_PLAN_IMBALANCE = PREFIX + "pipeline_plan_imbalance"

# --- the operator's own /metrics (disttrain_operator/opmetrics.py) --------------
OPERATOR_PREFIX = PREFIX + "operator_"
OPERATOR_JOBS = OPERATOR_PREFIX + "jobs"  # gauge, by phase
OPERATOR_RECONCILE_SECONDS = OPERATOR_PREFIX + "reconcile_seconds"  # histogram
OPERATOR_RECONCILE_ERRORS = OPERATOR_PREFIX + "reconcile_errors"  # counter
OPERATOR_GANG_RESTARTS = OPERATOR_PREFIX + "gang_restarts"  # counter, by reason
OPERATOR_API_REQUESTS = OPERATOR_PREFIX + "api_requests"  # counter, by verb and resource
OPERATOR_STATUS_WRITES = OPERATOR_PREFIX + "status_writes"  # counter, by kind
# Counters (labels namespace, job): fault-tolerant replicas lost and replaced alone; quorum regrowths.
OPERATOR_FT_REPLICAS_LOST = OPERATOR_PREFIX + "ft_replicas_lost"
OPERATOR_FT_REPLICAS_JOINED = OPERATOR_PREFIX + "ft_replicas_joined"
