"""Chaos on the cluster: three worker kills at random steps of one run, and the final
parameters equal those of an uninterrupted run of the same job (five kills of `disttrain local`
ranks: tests/dist/test_local_chaos.py).

Both runs go through the operator on the same cluster, with the same pod resources and
OMP_NUM_THREADS pinned, so the arithmetic is the same; only the kills differ. Each kill
is a SIGKILL of a trainer (the pod turns Failed), the operator restarts the gang, and the
trainers resume from the newest complete checkpoint on the claim the operator made for the job
(the default: no checkpoint volume in the spec).
"""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from .conftest import (  # type: ignore[import-not-found]
    Kubectl,
    OperatorProcess,
    checkpoint_dir,
    checkpoint_steps,
    job_manifest,
)

pytestmark = pytest.mark.timeout(900)
# Kills are planned among the first KILL_WINDOW steps; each lands some steps after its target
# (the test sees a checkpoint and a running pod through the API, then sleeps up to a second):
# on an idle machine, which trains this job at up to ~100 steps a second, the last kill lands
# by step ~350. STEPS leaves a margin of several seconds of training after that, so that no kill
# meets a trainer that is already done (a kill after the last step fails by name), without
# training thousands of steps twice on a loaded 2-core CI machine. The pods are held to
# WORKER_CPU: the cluster outweighs the test process for CPU, and at 500m a gang trained all
# 1200 steps (37 s from start to exit) before this test, polling from a busy host, killed it.
STEPS, INTERVAL, KILLS, KILL_WINDOW = 1200, 10, 3, 240
WORKER_CPU = "250m"


def chaos_job(name: str, ns: str) -> dict[str, Any]:
    obj = job_manifest(name, ns, steps=STEPS,
                       workers={"replicas": 2, "resources": {"cpu": WORKER_CPU, "memory": "768Mi"},
                                "template": {"env": [{"name": "OMP_NUM_THREADS", "value": "1"}]}},
                       model={"name": "mlp", "hidden": 256, "layers": 3},
                       data={"batchSize": 64},
                       checkpoint={"intervalSteps": INTERVAL, "keep": 2},
                       runPolicy={"backoffLimit": KILLS + 2})
    obj["spec"]["training"].update(evalIntervalSteps=0, logIntervalSteps=10)
    return obj


def final_parameters(kubectl: Kubectl, ns: str, name: str) -> dict[str, torch.Tensor]:
    step = max(checkpoint_steps(kubectl, ns, name))
    assert step == STEPS, f"{name}: newest checkpoint is step {step}, not {STEPS}"
    folder = checkpoint_dir(kubectl, ns, name)
    assert folder is not None
    state = torch.load(folder / f"step-{step:08d}" / "state.pt", map_location="cpu", weights_only=False)
    return {k: v for k, v in state["model"].items() if isinstance(v, torch.Tensor)}


def restarts(kubectl: Kubectl, ns: str, job: str) -> int:
    return int((kubectl.job(ns, job).get("status") or {}).get("restarts") or 0)


def wait_restarts(kubectl: Kubectl, ns: str, job: str, n: int) -> None:
    kubectl.wait_for(f"{job} restart {n}", lambda: restarts(kubectl, ns, job) >= n, timeout=120, interval=0.5)


def wait_for_checkpoint(kubectl: Kubectl, ns: str, job: str, step: int) -> int:
    def reached() -> int:
        status = kubectl.job(ns, job).get("status") or {}
        if status.get("phase") in ("Succeeded", "Failed"):
            raise AssertionError(f"{job} finished before the kill planned after step {step}: {status}")
        newest = max(checkpoint_steps(kubectl, ns, job), default=0)
        return newest if newest >= step else 0

    return int(kubectl.wait_for(f"{job} to checkpoint step {step}", reached, timeout=300, interval=0.3))


def wait_running(kubectl: Kubectl, ns: str, job: str, pod: str) -> None:
    """Until `pod` of the current gang runs its trainer (not the last gang's pod, still
    terminating under the same name)."""
    def running() -> bool:
        status = kubectl.job(ns, job).get("status") or {}
        if status.get("phase") in ("Succeeded", "Failed"):
            raise AssertionError(f"{job} finished before {pod} could be killed: {status}")
        attempt = str(status.get("attempt") or 0)
        found = next((p for p in kubectl.pods(ns, job) if p["metadata"]["name"] == pod
                      and p["metadata"]["labels"].get("disttrain.dev/restart-attempt") == attempt
                      and not p["metadata"].get("deletionTimestamp")), None)
        statuses = (found or {}).get("status", {}).get("containerStatuses") or []
        return any("running" in (s.get("state") or {}) for s in statuses)

    kubectl.wait_for(f"{pod} running", running, timeout=180, interval=0.3)


def kill_when_running(cluster: Any, kubectl: Kubectl, ns: str, job: str, pod: str) -> None:
    """SIGKILL the trainer of `pod` in the current gang. Its status can lag the runtime by a
    moment (the container listed as running has just exited); then look again, and say why
    it exited so an unplanned exit is visible in the failure."""
    from localcluster import ContainerGone  # type: ignore[import-not-found]

    for _ in range(5):
        wait_running(kubectl, ns, job, pod)
        try:
            cluster.kill_pod_container(ns, pod, "trainer")
            return
        except ContainerGone as e:
            state = [(p["metadata"]["labels"].get("disttrain.dev/restart-attempt"), s.get("state"))
                     for p in kubectl.pods(ns, job) if p["metadata"]["name"] == pod
                     for s in p.get("status", {}).get("containerStatuses") or []]
            print(f"{pod}: {e}; container states now: {state}; status: {kubectl.job(ns, job).get('status')}")
            time.sleep(1.0)
    raise AssertionError(f"{pod}'s trainer exited before every attempt to kill it")


@pytest.fixture
def names() -> Iterator[tuple[str, str]]:
    suffix = uuid.uuid4().hex[:5]
    yield (f"chaos-ref-{suffix}", f"chaos-{suffix}")  # their checkpoints go with their namespace


def test_three_kills_at_random_steps_end_at_the_uninterrupted_parameters(
    request: pytest.FixtureRequest, kubectl: Kubectl, operator: OperatorProcess, namespace: str,
    names: tuple[str, str],
) -> None:
    cluster = request.getfixturevalue("local_cluster")  # SIGKILLs a container: the local cluster only
    reference, chaos = names
    for name in names:  # at once: the reference costs no extra wall time
        kubectl.apply(chaos_job(name, namespace))
    rng = random.Random(20240605)  # fixed: the same "random" steps every run
    # Kill targets among the first KILL_WINDOW steps (the rest is slack for the last restart);
    # each kill waits for a checkpoint the current gang wrote (newer than any before the
    # last kill), then a random fraction of an interval, so kills land on any step.
    targets = sorted(rng.sample(range(INTERVAL, KILL_WINDOW, INTERVAL), KILLS))
    killed: list[tuple[int, str]] = []
    newest = 0
    for target in targets:
        newest = wait_for_checkpoint(kubectl, namespace, chaos, max(target, newest + INTERVAL))
        time.sleep(rng.uniform(0.0, 1.0))
        victim = f"{chaos}-worker-{rng.randrange(2)}"
        kill_when_running(cluster, kubectl, namespace, chaos, victim)
        newest = max(checkpoint_steps(kubectl, namespace, chaos))
        assert newest < STEPS, f"kill {len(killed) + 1} came after the last step ({newest}): raise STEPS"
        killed.append((newest, victim))
        wait_restarts(kubectl, namespace, chaos, len(killed))
    print(f"killed (newest checkpoint step, pod): {killed}")
    done = {name: kubectl.wait_phase(namespace, name, ("Succeeded", "Failed"), timeout=600) for name in names}
    for name, job in done.items():
        assert job["status"]["phase"] == "Succeeded", (name, job["status"])
    assert done[chaos]["status"]["restarts"] == KILLS and done[reference]["status"]["restarts"] == 0
    ref, got = final_parameters(kubectl, namespace, reference), final_parameters(kubectl, namespace, chaos)
    assert ref.keys() == got.keys() and ref
    worst = max(float((ref[k].double() - got[k].double()).abs().max()) for k in ref)
    print(f"max |chaos - reference| over {len(ref)} tensors: {worst:.3g}")
    assert worst <= 1e-6
    assert done[chaos]["status"]["result"]["resumedFromStep"] > 0
