"""The `DistTrainJob` API shared by the operator, the CLI and the trainer.

What lives here is every fact both sides must agree on: the typed model
(`model`), its parsing (`dataparse`) and cross-field rules (`validation`), the
CRD generated from it (`crd`), the env contract, labels and names
(`constants`), the exit codes (`exitcodes`) and the Prometheus series the
operator reads back (`metric_names`).

It imports only the standard library and PyYAML: never kopf, the Kubernetes
client or torch, and neither `disttrain_operator` nor `disttrain_trainer`
(tests/unit/test_import_rules.py enforces it).
"""
