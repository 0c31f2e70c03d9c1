"""The disttrain operator (kopf): reconcile DistTrainJobs into gangs of pods, recover them, report.

Import nothing heavy here: the CLI (disttrain_cli) reads `__version__` and the settings without
kopf or the Kubernetes client installed. The API lives in `disttrain_api`; this package imports
neither the trainer nor the CLI.
"""

__version__ = "0.1.0"
