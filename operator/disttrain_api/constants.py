"""Names shared by the operator, the local launcher and the trainer.

The env contract is the only interface between whoever starts a worker (the
operator's pods, `disttrain local`) and the trainer: keep it in one place.
"""

from __future__ import annotations

# --- env contract (set by the operator and by `disttrain local`) -------------
ENV_MASTER_ADDR = "MASTER_ADDR"
ENV_MASTER_PORT = "MASTER_PORT"
ENV_WORLD_SIZE = "WORLD_SIZE"
ENV_RANK = "RANK"  # set when a process is one rank; absent in a pod with procsPerWorker > 1
ENV_LOCAL_RANK = "LOCAL_RANK"
ENV_NODE_RANK = "NODE_RANK"  # = worker pod index
ENV_NPROC_PER_NODE = "NPROC_PER_NODE"
ENV_JOB = "DISTTRAIN_JOB"
# The job's namespace: a label of every metric series, and part of spec.checkpoint.uri's prefix
# (<uri>/<namespace>/<job>), so jobs of one name in two namespaces never share checkpoints.
ENV_NAMESPACE = "DISTTRAIN_NAMESPACE"
LOCAL_NAMESPACE = "local"  # what `disttrain local` sets
ENV_CONFIG = "DISTTRAIN_CONFIG"  # path of the spec rendered as JSON
ENV_RESTART_ATTEMPT = "DISTTRAIN_RESTART_ATTEMPT"
# The job's UID: with the restart attempt it names a checkpoint writer (checkpoint fencing);
# absent for runs started by hand or by `disttrain local`.
ENV_JOB_UID = "DISTTRAIN_JOB_UID"
# Optional overrides (defaults come from the spec):
ENV_CHECKPOINT_DIR = "DISTTRAIN_CHECKPOINT_DIR"  # default spec.checkpoint.path
ENV_RUN_DIR = "DISTTRAIN_RUN_DIR"  # JSON-lines metrics logs, summary.json, plots
ENV_METRICS_PORT = "DISTTRAIN_METRICS_PORT"  # base port; rank serves base + LOCAL_RANK; 0 = off
ENV_TERMINATION_LOG = "DISTTRAIN_TERMINATION_LOG"  # rank 0 writes its summary JSON here
ENV_DEVICE = "DISTTRAIN_DEVICE"  # force "cpu" or "cuda"
# "true": a pod that asks for GPUs but sees none trains on CPU (with a warning) instead of
# failing with exit 2; the operator sets it for every job when its own setting allows it.
ENV_ALLOW_CPU_FALLBACK = "DISTTRAIN_ALLOW_CPU_FALLBACK"
# Seconds a rank waits for MASTER_ADDR to resolve, for the gang to join and for a
# collective to complete (default 300); past it the rank exits FAILED and is retried.
ENV_RENDEZVOUS_TIMEOUT = "DISTTRAIN_RENDEZVOUS_TIMEOUT_S"

DEFAULT_MASTER_PORT = 29500
DEFAULT_TERMINATION_LOG = "/dev/termination-log"
CONFIG_FILENAME = "config.json"
# What a run leaves in its run dir: rank 0's summary (also its termination message) and each
# rank's JSON-lines log, read by the launcher, `disttrain explain` and the plot.
SUMMARY_FILENAME = "summary.json"
RANK_METRICS_FILENAME = "metrics-rank{rank}.jsonl"
# The trained model a successful run exports next to its checkpoints (<checkpoint dir>/export/):
# weights as safetensors keyed like the model's state_dict, and the model spec that built it.
# A directory holding EXPORT_WEIGHTS_FILENAME is also what spec.model.init accepts.
EXPORT_DIRNAME = "export"
EXPORT_WEIGHTS_FILENAME = "model.safetensors"
EXPORT_SPEC_FILENAME = "model.json"
CONFIG_MOUNT_DIR = "/etc/disttrain"  # read-only: the config; the federated TLS / token dirs sit inside
# Worker pods run with a read-only root filesystem; these emptyDirs are what they may write:
# the run dir (JSON-lines logs, summary, plots) and a tmp that HOME and the library caches
# (matplotlib, torch inductor, triton) point into.
RUN_MOUNT_DIR = "/run/disttrain"
TMP_MOUNT_DIR = "/tmp"

# --- labels and annotations ---------------------------------------------------
LABEL_JOB = "disttrain.dev/job-name"
LABEL_REPLICA_INDEX = "disttrain.dev/replica-index"
LABEL_ROLE = "disttrain.dev/role"
LABEL_RESTART_ATTEMPT = "disttrain.dev/restart-attempt"
ROLE_WORKER = "worker"
ROLE_AGGREGATOR = "aggregator"
ROLE_CLIENT = "client"
ROLE_SERVER = "server"

GPU_RESOURCE = "nvidia.com/gpu"

# --- federated / parameter-server topologies ----------------------------------
# Federated / parameter-server topologies: which side a pod plays and where the
# gRPC service (aggregator or parameter server) listens, as host:port.
ENV_ROLE = "DISTTRAIN_ROLE"
ENV_SERVER_ADDR = "DISTTRAIN_SERVER_ADDR"  # paramserver: every shard's host:port, comma-separated, shard 0 first
# Set on servers run by a Deployment: after the last round / step keep serving "done" until
# stopped (SIGTERM), since a container that exits would be restarted and replay the end.
ENV_SERVE_UNTIL_STOPPED = "DISTTRAIN_SERVE_UNTIL_STOPPED"
# Channel security of the federated aggregator and the parameter servers, mounted from
# Secrets by the operator: a folder with ca.crt / tls.crt / tls.key (clients read only
# ca.crt), and a folder of identity credentials: a server finds the key every credential
# is derived from (identities.SERVER_KEY), a client or worker pod one file per identity it
# hosts, named by the identity (client-07, worker-3) and nothing else.
ENV_TLS_DIR = "DISTTRAIN_TLS_DIR"
ENV_IDENTITY_DIR = "DISTTRAIN_IDENTITY_DIR"
# Name the server certificate is issued for, when clients dial it by another name (an IP).
ENV_TLS_SERVER_NAME = "DISTTRAIN_TLS_SERVER_NAME"
TLS_MOUNT_DIR = "/etc/disttrain/tls"
IDENTITY_MOUNT_DIR = "/etc/disttrain/identity"
# Names of the pod volumes holding them (reserved: a workers.template volume may not take them).
TLS_VOLUME = "disttrain-tls"
IDENTITY_VOLUME = "disttrain-identity"
LABEL_MODE = "disttrain.dev/mode"
# Mesh layout of a gang, for humans (kubectl describe): "dp=2,pp=2,tp=1".
ANNOTATION_MESH = "disttrain.dev/mesh"

# --- fault-tolerant data parallel (spec.faultTolerance) ----------------------
# Each worker pod is a replica group of its own: MASTER_ADDR is the pod's own address (its group's
# store, and the address peers reach its manager, checkpoint server and all-reduce at), WORLD_SIZE
# the group's size (workers.procsPerWorker), NODE_RANK 0 (the pod is the only node of its group's
# world), DISTTRAIN_FT_REPLICA the replica index. The job's lighthouse (torchft's quorum server)
# runs as role lighthouse; replicas find it in torchft's own variable.
ENV_FT_REPLICA = "DISTTRAIN_FT_REPLICA"  # 0 .. workers.replicas - 1
ENV_FT_LIGHTHOUSE = "TORCHFT_LIGHTHOUSE"  # http://host:port
ROLE_LIGHTHOUSE = "lighthouse"
DEFAULT_LIGHTHOUSE_PORT = 29510

# --- object storage (spec.objectStore): the names boto3 / s3fs read ------------
# From the Secret spec.objectStore.credentialsSecret (secretKeyRef: the operator never reads it).
ENV_AWS_ACCESS_KEY_ID = "AWS_ACCESS_KEY_ID"
ENV_AWS_SECRET_ACCESS_KEY = "AWS_SECRET_ACCESS_KEY"
OBJECT_STORE_SECRET_KEYS = (ENV_AWS_ACCESS_KEY_ID, ENV_AWS_SECRET_ACCESS_KEY)
ENV_AWS_ENDPOINT_URL = "AWS_ENDPOINT_URL"  # spec.objectStore.endpoint
ENV_AWS_REGION = "AWS_REGION"  # spec.objectStore.region (AWS_DEFAULT_REGION too, for older clients)
ENV_AWS_DEFAULT_REGION = "AWS_DEFAULT_REGION"
OBJECT_STORE_SCHEME = "s3://"

# --- trainer test hooks (fault injection; never set in production) ------------
# Step number: rank 0 hard-kills itself (SIGKILL) halfway through writing that step's checkpoint.
ENV_FAULT_KILL_IN_CHECKPOINT = "DISTTRAIN_FAULT_KILL_IN_CHECKPOINT"
# Seconds a fault-tolerant replica sleeps after each committed step: paces a cheap run so that a
# test's kill lands mid-run and a replacement (seconds to start) rejoins before the end.
ENV_FAULT_STEP_SLEEP = "DISTTRAIN_FAULT_STEP_SLEEP_S"
# Where datasets are packed into shard files (default: <tmp>/disttrain-data).
ENV_DATA_CACHE = "DISTTRAIN_DATA_CACHE"
