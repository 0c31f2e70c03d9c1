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

# --- federated mode (aggregator and client processes) -------------------------
FED_ROUND = PREFIX + "federated_round"
FED_ROUND_SECONDS = PREFIX + "federated_round_seconds"
FED_CLIENTS_SAMPLED = PREFIX + "federated_clients_sampled"
FED_CLIENTS_ANSWERED = PREFIX + "federated_clients_answered"
FED_CLIENTS_DROPPED = PREFIX + "federated_clients_dropped"
FED_UPDATES_REJECTED = PREFIX + "federated_updates_rejected"
FED_ROUND_RETRIES = PREFIX + "federated_round_retries"
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
PS_COMPUTE_SECONDS = PREFIX + "paramserver_compute_seconds"
PS_DATA_SECONDS = PREFIX + "paramserver_data_seconds"
