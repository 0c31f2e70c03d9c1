"""What the trainer measures and exports: the common time series (compute, exposed and busy
communication, data, idle) on one process's Prometheus registry and JSON-lines log (sink.py),
the collective loops' per-rank metrics (step_metrics.py), the federated and parameter-server
series, and model FLOPs / MFU."""
