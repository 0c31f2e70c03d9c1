"""The `DistTrainJob` API shared by the operator, the CLI and the trainer.

What lives here is every fact both sides must agree on: the typed model
(`model`, one module per part of the spec), its parsing (`dataparse`) and
cross-field rules (`validation`, running `layout_rules`, `mode_block_rules` and
`pod_rules`), the CRD generated from it (`crd`), the env contract, labels and
names (`constants`), the pods' credentials (`identities`), the exit codes
(`exitcodes`) and the Prometheus series the operator reads back (`metric_names`).

It imports only the standard library and PyYAML: never kopf, the Kubernetes
client or torch, and none of `disttrain_operator`, `disttrain_trainer`, `disttrain_cli`
(tests/unit/test_import_rules.py enforces it).
"""
