"""disttrain trainer: what runs inside a worker pod (`python -m disttrain_trainer`)."""

__version__ = "0.1.0"
