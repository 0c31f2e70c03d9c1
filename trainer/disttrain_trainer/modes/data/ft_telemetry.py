"""A fault-tolerant replica's own series beside every mode's (telemetry/step_metrics.py): the
quorum it trains in, the steps it discarded, its recoveries from a live peer and the bytes of
LocalSGD / DiLoCo synchronisations (names in disttrain_api.metric_names). The operator reads the
quorum from here for status.replicaGroups; the JSON-lines log gets one event per quorum change."""

from __future__ import annotations

from typing import Any

from disttrain_api import metric_names as names

from ...telemetry.step_metrics import Metrics


class ReplicaSeries:
    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics
        self.size = metrics.gauge(names.FT_QUORUM_SIZE, "Replicas in the quorum of this replica's latest step.")
        self.id = metrics.gauge(names.FT_QUORUM_ID, "The lighthouse's id of that quorum (changes with its members).")
        self.discards = metrics.counter(names.FT_STEPS_DISCARDED,
                                        "Step attempts (or syncs) not committed because a peer failed during them.")
        self.recoveries = metrics.counter(names.FT_RECOVERIES, "Times this replica received the state of a live peer.")
        self.recovery_s = metrics.gauge(names.FT_RECOVERY_SECONDS, "Seconds the last recovery from a live peer took.")
        self.sync_bytes = metrics.counter(names.SYNC_BYTES,
                                          "Bytes all-reduced by LocalSGD / DiLoCo synchronisations (parameters "
                                          "or pseudo-gradients).")  # fmt: skip
        self._last: tuple[int, int] | None = None

    def quorum(self, manager: Any, step: int) -> None:
        """The quorum this replica trains in from training step `step` on."""
        size, qid = int(manager.num_participants()), int(manager._quorum_id)  # noqa: SLF001 - torchft keeps it private
        if self.metrics.enabled:
            self.size.set(size)
            self.id.set(qid)
        if (size, qid) != self._last:
            if self._last is not None and size != self._last[0]:
                print(f"disttrain-trainer: quorum {self._last[0]} -> {size} replicas at step {step} "
                      f"(quorum {qid})", flush=True)  # fmt: skip
            self._last = (size, qid)
            self.metrics.write({"event": "quorum", "step": step, "quorum": size, "quorum_id": qid})

    def discarded(self) -> None:
        if self.metrics.enabled:
            self.discards.inc()

    def recovered(self, seconds: float) -> None:
        if self.metrics.enabled:
            self.recoveries.inc()
            self.recovery_s.set(seconds)

    def synced(self, nbytes: int) -> None:
        if self.metrics.enabled:
            self.sync_bytes.inc(nbytes)
