"""What a federated round and a whole run report: a round's time split, its record in the metrics
log and the history, and the run's summary in the keys every mode reports (a round is a step).

With central differential privacy a round's record keeps only what the guarantee covers or what
carries no client's data (RELEASED_WITH_DP; the aggregator adds epsilon and delta): the noised
model's test accuracy and the round's bookkeeping. Everything computed from individual clients'
values (their losses, sample counts, timings, how many were sampled, answered or clipped, the
bytes they moved) stays inside the aggregator, and so out of the history, the metrics log, the
checkpoint's history and the summary.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...telemetry.sink import time_fractions
from .rounds import RoundAttempt

# The keys of a private round's record: an allow-list, so a key added to the record later is withheld.
RELEASED_WITH_DP = ("step", "round", "attempt", "steps", "step_s", "test_accuracy")
CLIENT_ID = re.compile(r"\bclient-\d+\b")  # identities.client_ids


def without_client_ids(log: Callable[[str], None]) -> Callable[[str], None]:
    """A private aggregator's log: no line names a client (a refused late update would tell that
    client was sampled, and Poisson sampling's amplification needs the sample kept secret)."""
    return lambda line: log(CLIENT_ID.sub("a client", line))


@dataclass(frozen=True, kw_only=True)
class RoundTimes:
    step_s: float
    compute_s: float
    data_s: float
    comm_s: float  # all of it exposed: nothing overlaps a client's transfers
    idle_s: float


def round_times(ra: RoundAttempt, answered: list[str], round_s: float) -> RoundTimes:
    """A round is this mode's step, seen through its average answered client: its local training
    (compute), loading its rows (data), receiving the model and sending its update (communication,
    all of it exposed: nothing overlaps a client's transfers) and the rest of the round (idle:
    waiting for the other clients, aggregation and evaluation on the aggregator)."""

    def avg(d: dict[str, float]) -> float:
        vals = [d[c] for c in answered if c in d]
        return sum(vals) / len(vals) if vals else 0.0

    compute = min(avg(ra.client_compute_s), round_s)
    data = min(avg(ra.client_data_s), round_s - compute)
    comm = min(avg(ra.client_comm_s), round_s - compute - data)
    return RoundTimes(step_s=round_s, compute_s=compute, data_s=data, comm_s=comm,
                      idle_s=round_s - compute - data - comm)  # fmt: skip


def round_record(ra: RoundAttempt, t: RoundTimes, *, round_no: int, answered: list[str], dropped: int,
                 accuracy: float | None, private: bool = False) -> dict[str, Any]:  # fmt: skip
    """The round's line in the metrics log and its entry in the history (checkpointed); `private`:
    central DP, only the RELEASED_WITH_DP keys."""
    losses = [v for v in ra.client_loss.values() if math.isfinite(v)]
    record = {
        "step": round_no, "round": round_no, "attempt": ra.attempt,
        "loss": sum(losses) / len(losses) if losses else None,
        "steps": 1, "step_s": t.step_s, "compute_s": t.compute_s, "comm_exposed_s": t.comm_s,
        "comm_busy_s": t.comm_s, "data_s": t.data_s, "idle_s": t.idle_s,
        "clients_sampled": len(ra.sampled), "clients_answered": len(answered), "clients_dropped": dropped,
        "bytes_up": ra.bytes_up, "bytes_down": sum(len(c.data) for c in ra.model_chunks) * len(ra.served),
        "test_accuracy": accuracy, "samples": ra.samples,
        "samples_per_s": ra.samples / t.step_s if t.step_s > 0 else 0.0,  # the sampled clients' local training
        # Secure rounds: clients whose masks were removed from shares after they dropped out.
        "unmasked_dropped": len(ra.secure.plan.dropped) if ra.secure and ra.secure.plan else 0,
        **(ra.total.info() if ra.total is not None else {}),
    }  # fmt: skip
    return {k: record[k] for k in RELEASED_WITH_DP} if private else record


def run_summary(history: list[dict[str, Any]], *, rounds: int, attempts: int, privacy: dict[str, Any] | None,
                resumed_from: int | None, wall_s: float) -> dict[str, Any]:  # fmt: skip
    """The run's summary from the rounds' records; `privacy`: the DP accountant's report, if any (the
    records then hold no client's timings or bytes: no time split, no byte totals)."""
    h = history
    acc = [r.get("test_accuracy") for r in h]

    def total(key: str) -> float:
        return sum(float(r.get(key) or 0.0) for r in h)

    return {
        "mode": "federated",
        "steps": rounds,
        "rounds": rounds,
        "testAccuracy": acc[-1] if acc else None,
        "accuracyPerRound": acc,
        "roundSMedian": float(np.median([r["step_s"] for r in h])) if h else None,
        **({} if privacy is not None else {
            **time_fractions(step_s=total("step_s"), compute_s=total("compute_s"), data_s=total("data_s"),
                             exposed_s=total("comm_exposed_s"), busy_s=total("comm_busy_s"), idle_s=total("idle_s")),
            "bytesUp": sum(r["bytes_up"] for r in h),
            "bytesDown": sum(r["bytes_down"] for r in h),
        }),
        "roundAttempts": attempts,
        **({"privacy": privacy} if privacy is not None else {}),
        "resumedFromStep": resumed_from,
        "wallS": wall_s,
    }
