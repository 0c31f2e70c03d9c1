"""Disruptions on a real cluster: a suspend and a node drain mid-run each lose at most one step of
work and count no restart.

One job is suspended, resumed, and then its rank 0's node is drained. Checkpoints are written
only on a stop (intervalSteps far beyond the run), so the step a gang resumes from is the step
its predecessor saved when it got SIGTERM. Rank 0 logs every step; its log (followed with
`kubectl logs -f` until the pod is gone) is the independent record of the step it reached.
"""

from __future__ import annotations

import re
import subprocess
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from .conftest import (  # type: ignore[import-not-found]
    Kubectl,
    OperatorProcess,
    assert_no_repeated_events,
    checkpoint_steps,
    job_manifest,
)

pytestmark = pytest.mark.timeout(600)
JOBS = "disttrainjobs.disttrain.dev"
STEP_LINE = re.compile(r"^step (\d+)/\d+ ")
RESUMED = re.compile(r"resumed from step (\d+)")
STOPPED = re.compile(r"stopped on request after step (\d+)")
STEPS_PER_ATTEMPT = 15  # steps each gang trains (and logs) before it is disrupted


class Rank0Log:
    """`kubectl logs -f` of one incarnation of a job's rank-0 pod, read by a thread until it exits."""

    def __init__(self, kubectl: Kubectl, ns: str, pod: str) -> None:
        self.proc = subprocess.Popen(["kubectl", "logs", "-f", pod, "-n", ns, "-c", "trainer"], env=kubectl.env,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
        self.lines: list[str] = []
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip())

    def steps(self) -> list[int]:
        return [int(m.group(1)) for line in list(self.lines) if (m := STEP_LINE.match(line))]

    def find(self, pattern: re.Pattern[str]) -> int | None:
        found = [int(m.group(1)) for line in list(self.lines) if (m := pattern.search(line))]
        return found[-1] if found else None

    def wait_done(self, timeout: float = 120) -> None:
        """Until the container exited (the stream ends with it)."""
        self.proc.wait(timeout=timeout)
        self.thread.join(timeout=10)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def tail(self) -> str:
        return "\n".join(self.lines[-15:])


@pytest.fixture
def job_name() -> Iterator[str]:
    yield f"disrupt-{uuid.uuid4().hex[:5]}"  # its checkpoints go with its namespace


def rank0_pod(kubectl: Kubectl, ns: str, name: str, attempt: int) -> dict[str, Any] | None:
    for p in kubectl.pods(ns, name):
        labels = p["metadata"]["labels"]
        if (labels.get("disttrain.dev/replica-index") == "0" and labels.get("disttrain.dev/restart-attempt")
                == str(attempt) and p["status"].get("phase") == "Running"
                and not p["metadata"].get("deletionTimestamp")):  # fmt: skip
            return p
    return None


def follow_attempt(kubectl: Kubectl, ns: str, name: str, attempt: int, logs: list[Rank0Log]) -> Rank0Log:
    """Rank 0's log of the given gang attempt, once it has trained STEPS_PER_ATTEMPT steps."""
    pod = kubectl.wait_for(f"rank 0 of attempt {attempt} running", lambda: rank0_pod(kubectl, ns, name, attempt),
                           timeout=240, interval=0.5)  # fmt: skip
    log = Rank0Log(kubectl, ns, pod["metadata"]["name"])
    logs.append(log)
    first = kubectl.wait_for(f"attempt {attempt}'s first step", lambda: log.steps()[:1], timeout=180, interval=0.2)[0]
    kubectl.wait_for(f"attempt {attempt} training {STEPS_PER_ATTEMPT} steps",
                     lambda: log.steps()[-1] >= first + STEPS_PER_ATTEMPT, timeout=180, interval=0.2)  # fmt: skip
    return log


def stop_record(kubectl: Kubectl, ns: str, log: Rank0Log, name: str) -> tuple[int, int]:
    """After the pod exited: (the last step rank 0 logged, the step it checkpointed on the stop)."""
    log.wait_done()
    saved = log.find(STOPPED)
    assert saved is not None, f"rank 0 of {name} did not checkpoint on SIGTERM:\n{log.tail()}"
    steps = checkpoint_steps(kubectl, ns, name)
    assert saved in steps, (saved, steps)
    return log.steps()[-1], saved


@pytest.mark.whole_cluster  # drains a node
def test_suspend_and_a_node_drain_each_lose_at_most_one_step_and_count_no_restart(
    kubectl: Kubectl, operator: OperatorProcess, namespace: str, job_name: str
) -> None:
    name = job_name
    obj = job_manifest(name, namespace, steps=1_000_000,
                       model={"name": "mlp", "hidden": 128, "layers": 2},
                       training={"steps": 1_000_000, "logIntervalSteps": 1, "evalIntervalSteps": 0},
                       checkpoint={"intervalSteps": 1_000_000, "keep": 2})  # on the claim the operator makes
    kubectl.apply(obj)
    logs: list[Rank0Log] = []
    drained: str | None = None
    try:
        # ---- suspend mid-run, then resume
        first = follow_attempt(kubectl, namespace, name, 0, logs)
        kubectl.run("patch", JOBS, name, "-n", namespace, "--type=merge", "-p",
                    '{"spec":{"runPolicy":{"suspend":true}}}')  # fmt: skip
        kubectl.wait_phase(namespace, name, ("Suspended",), timeout=60)
        reached, saved = stop_record(kubectl, namespace, first, name)
        assert abs(reached - saved) <= 1, f"suspended at step {reached}, saved step {saved}"
        kubectl.wait_for("the suspended job's pods to go", lambda: not kubectl.pods(namespace, name), timeout=90)
        kubectl.run("patch", JOBS, name, "-n", namespace, "--type=merge", "-p",
                    '{"spec":{"runPolicy":{"suspend":false}}}')  # fmt: skip
        second = follow_attempt(kubectl, namespace, name, 1, logs)
        assert second.find(RESUMED) == saved, f"stopped at {saved}, resumed:\n{second.tail()}"

        # ---- drain rank 0's node mid-run: the pods are evicted (deleted) with their grace period
        pod = rank0_pod(kubectl, namespace, name, 1)
        assert pod is not None
        drained = pod["spec"]["nodeName"]
        kubectl.run("drain", drained, "--ignore-daemonsets", "--delete-emptydir-data", "--force",
                    "--timeout=120s", timeout=150)  # fmt: skip
        reached, saved = stop_record(kubectl, namespace, second, name)
        assert abs(reached - saved) <= 1, f"drained at step {reached}, saved step {saved}"
        third = follow_attempt(kubectl, namespace, name, 2, logs)
        assert third.find(RESUMED) == saved, f"stopped at {saved}, resumed:\n{third.tail()}"

        status = kubectl.job(namespace, name)["status"]
        assert status["restarts"] == 0 and status["disruptions"] >= 1 and status["attempt"] == 2, status
        reasons = [e["reason"] for e in assert_no_repeated_events(kubectl, namespace, name)]
        assert {"Suspended", "Resumed", "Disrupted"} <= set(reasons), reasons
        assert rank0_pod(kubectl, namespace, name, 2)["spec"]["nodeName"] != drained  # type: ignore[index]
    finally:
        if drained is not None:
            kubectl.run("uncordon", drained, check=False)
        for log in logs:
            log.close()
        # The gang checkpoints its step on the way out: let it finish before the folder is removed.
        kubectl.run("delete", JOBS, name, "-n", namespace, "--ignore-not-found", "--wait=true", check=False)
        kubectl.wait_for("the job's pods to go", lambda: not kubectl.pods(namespace, name), timeout=120)
