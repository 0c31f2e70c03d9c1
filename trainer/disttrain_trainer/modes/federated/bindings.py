"""What a federated client's token is bound to, call by call (the aggregator checks it: serving.py)."""

from __future__ import annotations

JOIN = "join"  # Join: the bootstrap call, no session yet
WAIT = "wait:"  # GetTask: "wait:<the highest round heard of>"


def wait_binding(round_no: int) -> str:
    return f"{WAIT}{round_no}"


def round_binding(round_no: int, attempt: int) -> str:
    """PushUpdate and the secure stages: the round attempt of the task being answered."""
    return f"{round_no}.{attempt}"
