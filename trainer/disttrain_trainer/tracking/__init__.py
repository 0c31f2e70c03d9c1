"""Experiment tracking (spec.tracking): the scalars the job's tracking process writes into its
JSON-lines log, also as TensorBoard event files and into an MLflow run.

One process per job tracks, the one that sees the whole job: rank 0 of the collective modes, the
federated aggregator, parameter-server worker 0. Its metrics sink (telemetry/sink.py) hands every
record it logs to a `Tracker` (tracker.py), which maps it to tags once (scalars.py) and queues it
for each backend (tensorboard_backend.py, mlflow_backend.py), each on its own thread behind a
bounded queue (background.py): the training loop never waits for a disk or a server, and a
backend that fails loses records, counted, never the run.
"""
