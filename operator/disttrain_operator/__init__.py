"""disttrain operator, API model and CLI.

Import nothing heavy here: the trainer image and `disttrain validate` import
`disttrain_operator.api` without kopf or the Kubernetes client installed.
"""

__version__ = "0.1.0"
