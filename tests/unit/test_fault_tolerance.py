"""spec.faultTolerance and training.sync: the API, their cross-field rules, the learning-rate rule at a
smaller quorum, and the launcher's replica environment and its replace-or-restart decision (the
fault-tolerant all-reduce itself: test_ft_data_parallel.py)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from disttrain_api import constants as C
from disttrain_api import exitcodes
from disttrain_api.model import parse_spec, to_json
from disttrain_api.validation import check_job
from disttrain_trainer.launcher.env import Slot
from disttrain_trainer.launcher.gang import Failure
from disttrain_trainer.launcher.replicas import decide, replica_envs
from disttrain_trainer.modes.data.ft_quorum import step_quorum_due
from disttrain_trainer.modes.data.ft_state import quorum_lr_factor


def manifest(**spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "apiVersion": "disttrain.dev/v1alpha1", "kind": "DistTrainJob", "metadata": {"name": "job"},
        "spec": {"mode": "data", "workers": {"replicas": 3}, "model": {"name": "mlp"},
                 "data": {"name": "digits", "batchSize": 96}, "faultTolerance": {"minReplicas": 2}},
    }  # fmt: skip
    merged = copy.deepcopy(base)
    for key, value in spec.items():
        if isinstance(value, dict) and isinstance(merged["spec"].get(key), dict):
            merged["spec"][key].update(value)
        else:
            merged["spec"][key] = value
    return merged


def errors(obj: dict[str, Any]) -> list[str]:
    return [str(e) for e in check_job(obj)[1]]


def test_the_block_is_the_opt_in_and_round_trips() -> None:
    spec = parse_spec(manifest()["spec"])
    assert spec.fault_tolerant and spec.fault_tolerance is not None
    assert spec.fault_tolerance.min_replicas == 2 and spec.fault_tolerance.heartbeat_timeout_seconds == 5
    assert to_json(spec)["faultTolerance"] == {"enabled": True, "minReplicas": 2, "heartbeatTimeoutSeconds": 5,
                                               "quorumIntervalSteps": None}
    assert spec.fault_tolerance.quorum_interval == 10  # the default
    every = parse_spec(manifest(faultTolerance={"quorumIntervalSteps": 1})["spec"]).fault_tolerance
    assert every is not None and every.quorum_interval == 1
    assert not parse_spec(manifest(faultTolerance={"enabled": False})["spec"]).fault_tolerant
    assert not parse_spec({"mode": "data"}).fault_tolerant
    assert errors(manifest()) == []
    sync = parse_spec({"training": {"sync": {"kind": "diloco", "interval": 50}}}).training.sync
    assert (sync.kind, sync.every, sync.outer_optimizer.name, sync.outer_optimizer.lr) == ("diloco", 50, "nesterov", 0.7)
    assert parse_spec({}).training.sync.every == 1


@pytest.mark.parametrize(("change", "path", "words"), [
    ({"mode": "pipeline", "parallelism": {"pipeline": 3}}, "spec.faultTolerance", "only mode data"),
    ({"workers": {"replicas": 3, "procsPerWorker": 2}, "data": {"name": "digits", "batchSize": 96}},
     "spec.workers.procsPerWorker", "set dataStrategy: fsdp to shard each replica"),
    ({"faultTolerance": {"minReplicas": 4}}, "spec.faultTolerance.minReplicas", "4 must be <= workers.replicas 3"),
    ({"elastic": {"minReplicas": 1, "maxReplicas": 3}}, "spec.elastic", "cannot be combined with faultTolerance"),
    ({"training": {"gradientCompression": "powersgd"}}, "spec.training.gradientCompression", "fault-tolerant one"),
    ({"faultTolerance": {"quorumIntervalSteps": 0}}, "spec.faultTolerance.quorumIntervalSteps", ">= 1"),
    ({"faultTolerance": {"quorumIntervalSteps": 10}, "training": {"sync": {"kind": "diloco", "interval": 20}}},
     "spec.faultTolerance.quorumIntervalSteps", "once per training.sync.interval"),
    ({"training": {"sync": {"kind": "diloco", "interval": 20, "everyStepFirst": 40}}},
     "spec.training.sync.everyStepFirst", "40 is not supported with faultTolerance"),
])  # fmt: skip
def test_what_fault_tolerance_refuses_and_why(change: dict[str, Any], path: str, words: str) -> None:
    found = [e for e in errors(manifest(**change)) if e.startswith(path + ":")]
    assert found and words in found[0], errors(manifest(**change))


@pytest.mark.parametrize(("sync", "extra", "path", "words"), [
    ({"kind": "localsgd", "interval": 5}, {"mode": "tensor", "parallelism": {"tensor": 3}}, "spec.training.sync.kind",
     "mode tensor has none"),
    ({"kind": "diloco", "interval": 5}, {"parallelism": {"dataStrategy": "fsdp"}}, "spec.training.sync.kind", "shards them"),
    ({"kind": "diloco", "interval": 900}, {}, "spec.training.sync.interval", "never synchronise"),
    ({"kind": "diloco", "interval": 50, "everyStepFirst": 120}, {}, "spec.training.sync.everyStepFirst",
     "120 must be a multiple of training.sync.interval 50"),
    ({"kind": "localsgd", "interval": 50, "everyStepFirst": 500}, {}, "spec.training.sync.everyStepFirst",
     "500 must be below training.steps 500"),
    ({"kind": "every-step", "everyStepFirst": 100}, {}, "spec.training.sync.everyStepFirst",
     "applies to sync kinds localsgd and diloco"),
    ({"kind": "diloco", "interval": 50, "everyStepFirst": -50}, {}, "spec.training.sync.everyStepFirst", ">= 0"),
])  # fmt: skip
def test_sync_rules(sync: dict[str, Any], extra: dict[str, Any], path: str, words: str) -> None:
    obj = manifest(training={"steps": 500, "sync": sync}, **extra)
    del obj["spec"]["faultTolerance"]
    found = [e for e in errors(obj) if e.startswith(path + ":")]
    assert found and words in found[0], errors(obj)


class _Committed:
    """What step_quorum_due reads of torchft's Manager: its committed steps and its error."""

    def __init__(self, step: int, error: Exception | None = None) -> None:
        self.step, self.error = step, error

    def current_step(self) -> int:
        return self.step

    def errored(self) -> Exception | None:
        return self.error


def test_a_quorum_is_asked_every_k_committed_steps_and_at_once_after_a_failure() -> None:
    due = [s for s in range(1, 30) if step_quorum_due(_Committed(s), every=7, last_committed=True, after_alone=False)]
    assert due == [7, 14, 21, 28]  # the step count every member of the quorum shares
    assert all(step_quorum_due(_Committed(s), every=1, last_committed=True, after_alone=False) for s in range(1, 9))
    assert step_quorum_due(_Committed(3), every=7, last_committed=False, after_alone=False)  # the step failed
    assert step_quorum_due(_Committed(3, RuntimeError("peer died")), every=7, last_committed=True, after_alone=False)
    assert step_quorum_due(_Committed(3), every=7, last_committed=True, after_alone=True)  # rank 0 checkpointed


def test_learning_rate_follows_the_quorum() -> None:
    # Each replica keeps its batch: the global batch is quorum x batch, the lr scales with it.
    assert quorum_lr_factor("linear", 3, 4) == pytest.approx(0.75)
    assert quorum_lr_factor("sqrt", 1, 4) == pytest.approx(0.5)
    assert quorum_lr_factor("none", 1, 4) == 1.0
    assert quorum_lr_factor("linear", 4, 4) == 1.0


def test_hsdp_replicas_are_accepted() -> None:
    # Each replica group shards the model over its pod's processes; the groups replicate it.
    obj = manifest(workers={"replicas": 2, "procsPerWorker": 2}, parallelism={"dataStrategy": "fsdp"},
                   data={"name": "digits", "batchSize": 64})  # fmt: skip
    assert errors(obj) == []
    assert errors(manifest(parallelism={"dataStrategy": "fsdp"})) == []


@pytest.mark.parametrize("procs", [1, 2])
def test_replica_env_is_a_world_per_replica_plus_the_lighthouse(procs: int) -> None:
    slots = [Slot(rank=i, local_rank=i % procs, node_rank=i // procs) for i in range(3 * procs)]
    base = [(s, {C.ENV_WORLD_SIZE: str(3 * procs), C.ENV_RANK: str(s.rank), C.ENV_MASTER_PORT: "1"}) for s in slots]
    out = replica_envs(base, procs=procs, store_ports=[11, 12, 13], lighthouse_port=99, metrics_port=7)
    assert len(out) == 3 * procs + 1
    for i, (slot, env) in enumerate(out[:-1]):
        replica, group_rank = divmod(i, procs)
        assert (env[C.ENV_WORLD_SIZE], env[C.ENV_RANK], env[C.ENV_LOCAL_RANK]) == (str(procs), str(group_rank), str(group_rank))
        assert (env[C.ENV_NODE_RANK], env[C.ENV_FT_REPLICA]) == ("0", str(replica))
        # One store per replica group: its processes' world, and its Manager's.
        assert env[C.ENV_MASTER_PORT] == str(11 + replica) and env[C.ENV_FT_LIGHTHOUSE] == "http://127.0.0.1:99"
        assert C.ENV_ROLE not in env and slot.rank == i
    lh_slot, lh = out[-1]
    assert lh_slot.rank == 3 * procs and lh[C.ENV_ROLE] == C.ROLE_LIGHTHOUSE and lh[C.ENV_METRICS_PORT] == "7"


def _failure(code: int, *, stop_sent: bool = False) -> Failure:
    return Failure(rank=1, pid=1, returncode=code, log=Path("x"), log_tail=(), stop_sent=stop_sent)


def test_a_failed_replica_is_replaced_alone_until_too_few_are_left() -> None:
    killed = _failure(-9)
    assert decide(killed, healthy=2, min_replicas=2, restarts=0, backoff_limit=3) == "replace"
    assert decide(killed, healthy=1, min_replicas=2, restarts=0, backoff_limit=3) == "gang"
    assert decide(killed, healthy=2, min_replicas=2, restarts=3, backoff_limit=3) == "fail"
    # A replica stopped on request is a disruption: replaced whatever the restarts so far; one
    # that exited 3 unasked failed like any other.
    stopped = _failure(exitcodes.STOPPED, stop_sent=True)
    assert decide(stopped, healthy=2, min_replicas=1, restarts=3, backoff_limit=3) == "replace"
    assert decide(_failure(exitcodes.STOPPED), healthy=2, min_replicas=1, restarts=3, backoff_limit=3) == "fail"
    assert decide(_failure(exitcodes.CONFIG), healthy=2, min_replicas=1, restarts=0, backoff_limit=3) == "fail"
