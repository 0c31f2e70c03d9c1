"""disttrain operator, API model and CLI.

Import nothing heavy here: `disttrain validate` and `disttrain --help` run
without kopf or the Kubernetes client installed. The API model lives in
`disttrain_api`, which the trainer imports; the trainer never imports this package.
"""

__version__ = "0.1.0"
