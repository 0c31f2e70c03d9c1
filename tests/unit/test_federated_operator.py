"""Operator side of mode federated: a lost client pod is replaced alone (no gang restart),
and the job's result is the aggregator's summary that client 0 reports when it ends."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from disttrain_api import model as api
from disttrain_operator.decide import decide
from disttrain_operator.decision import Observed
from disttrain_operator.observe import PodView, format_time

NOW = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
SPEC = api.parse_spec({"mode": "federated", "workers": {"replicas": 2}, "runPolicy": {"backoffLimit": 2}})
STATUS = {
    "phase": "Running", "attempt": 0, "replicas": 2, "restarts": 0, "lastSpecReplicas": 2,
    "startTime": format_time(NOW - timedelta(seconds=30)), "observedGeneration": 1,
    "conditions": [{"type": "Created", "status": "True", "reason": "GangCreated"},
                   {"type": "Running", "status": "True", "reason": "GangRunning"}],
    "secrets": {"identity": "job1-identity-0a1b2c3d4e", "tls": "job1-tls-0a1b2c3d4e",
                "tlsNotAfter": format_time(NOW + timedelta(days=300))},
}  # fmt: skip


def client(index: int, phase: str = "Running", **kw: Any) -> PodView:
    values: dict[str, Any] = {"name": f"job1-client-{index}", "role": "client", "index": index, "attempt": 0,
                              "phase": phase, "scheduled": True, "ip": f"10.0.0.{index}"}  # fmt: skip
    values.update(kw)
    return PodView(**values)


def observe(pods: list[PodView], **status: Any) -> Observed:
    return Observed(generation=1, spec=SPEC, accepted=SPEC, status={**STATUS, **status}, pods=pods, now=NOW)


def test_a_deleted_client_pod_is_created_again_without_a_restart() -> None:
    plan = decide(observe([client(1)]))  # client 0 was deleted (e.g. its node drained)
    assert plan.create and not plan.delete_pods
    assert plan.status["restarts"] == 0 and plan.status["attempt"] == 0 and plan.status["phase"] == "Running"


def test_a_failed_client_pod_is_replaced_alone() -> None:
    plan = decide(observe([client(0), client(1, "Failed", exit_code=137, message="OOMKilled")]))
    assert plan.delete_pods == ["job1-client-1"] and not plan.create
    assert plan.status["attempt"] == 0 and plan.status["phase"] == "Running"


def test_the_result_is_the_aggregators_summary_from_client_0() -> None:
    summary = {"mode": "federated", "steps": 30, "rounds": 30, "testAccuracy": 0.95, "resumedFromStep": 12}
    done = [client(0, "Succeeded", exit_code=0, message=json.dumps(summary)), client(1, "Succeeded", exit_code=0)]
    plan = decide(observe(done))
    assert plan.status["phase"] == "Succeeded"
    assert plan.status["result"]["testAccuracy"] == 0.95 and plan.status["result"]["resumedFromStep"] == 12
    assert plan.delete_servers  # the aggregator Deployment goes once the clients are done
