"""What one failure costs with spec.faultTolerance on the local cluster, against today's gang restart.

The cluster counterpart of `fault_tolerance.py cost`: the same data-parallel job (digits MLP
hidden 128, 32 samples per replica and step, a step logged every step, --replicas one-process
replicas of --cpu each) is applied to the cluster twice in one run, once with
`faultTolerance: {minReplicas: 2, heartbeatTimeoutSeconds: 3}` and once without (a gang,
checkpoints every --ckpt-every steps). Worker 0's log is followed (`kubectl logs -f
--timestamps`); once it logs the kill step (seeded random, printed) at the full quorum, one
replica other than 0 (seeded random) is killed:

  --kill sigkill  its trainer's processes get SIGKILL from this machine (every node is a network
                  namespace of it): a crash, as fault_tolerance.py's local SIGKILL
  --kill delete   its pod is force-deleted; the kubelet still sends SIGTERM first (its minimum
                  grace period is 2 s), so the trainer may leave at a step boundary

Measured with one clock (the container runtime's log timestamps and this process share the
machine):

  seconds to the next step: fault tolerant, from the kill to the survivors' first step at a
      smaller quorum; gang restart, to the restarted gang's first step
  steps trained again: fault tolerant, step numbers worker 0 logged twice; gang restart, the
      step killed at minus the checkpoint step the new gang resumed from

For the fault-tolerant job the follow goes on until the replacement rejoins (the quorum is full
again) or --rejoin-timeout passes, and the job's status (attempt, restarts, replicaGroups) is
read: the operator's side of the same failure. The operator runs as a host process from this
checkout (as in the e2e tests), watching a namespace of its own.

--window W (seconds) measures throughput under periodic kills instead, as `fault_tolerance.py
window` does locally: each job runs W seconds (from its step 20, at the full quorum) twice, once
with a replica other than 0 killed every --kill-every seconds and once without; worker 0's steps
are followed across its restarts (a gang restart replaces its pod too), and samples kept per second
(fault tolerant: the quorum's samples of every step; gang restart: net steps, retrained ones not
counted) with kills are divided by those without.

    make cluster-up
    .venv/bin/python benchmarks/fault_tolerance_cluster.py --replicas 4 --seed 7 [--json out.json]
    .venv/bin/python benchmarks/fault_tolerance_cluster.py --window 600 --kill-every 120 --seed 7
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CRD = ROOT / "manifests" / "crd" / "disttrainjobs.yaml"
HEARTBEAT_S = 3
MIN_REPLICAS = 2
# Where the local benchmark draws its kill step: past start-up, well before the end.
KILL_STEPS = (60, 140)
# Worker 0's step line (modes/data/fault_tolerant.py and loop.py), after kubectl's timestamp.
STEP = re.compile(r"^(\S+) step (\d+)/\d+ (?:.*? quorum (\d+)/\d+)?")


@dataclass(frozen=True)
class Step:
    t: float
    step: int
    quorum: int | None


def kubeconfig() -> str:
    return os.environ.get("KUBECONFIG") or str(Path.home() / ".cache" / "disttrain" / "cluster" / "kubeconfig")


def kubectl(*args: str, check: bool = True, input_: str | None = None) -> str:
    got = subprocess.run(["kubectl", "--kubeconfig", kubeconfig(), *args], capture_output=True, text=True,
                         input=input_, timeout=120, check=False)  # fmt: skip
    if check and got.returncode != 0:
        raise RuntimeError(f"kubectl {' '.join(args)}: {got.stderr.strip()}")
    return got.stdout


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait(what: str, probe: Callable[[], Any], timeout: float, interval: float = 0.5) -> Any:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = probe()
        if got:
            return got
        time.sleep(interval)
    raise TimeoutError(f"waited {timeout:.0f} s for {what}")


def manifest(name: str, ns: str, *, ft: bool, args: argparse.Namespace) -> dict[str, Any]:
    """fault_tolerance.py's MLP job (same model, batch and optimizer), sized for the cluster."""
    batch = 32 * args.replicas
    spec: dict[str, Any] = {
        "mode": "data",
        "workers": {"replicas": args.replicas, "resources": {"cpu": args.cpu, "memory": "768Mi"}},
        "model": {"name": "mlp", "hidden": 128, "layers": 2},
        "data": {"name": "digits", "batchSize": batch, "seed": 0},
        "optimizer": {"name": "sgd", "lr": 0.1, "momentum": 0.9, "baseBatchSize": batch, "warmupSteps": 30},
        "training": {"steps": args.steps, "logIntervalSteps": 1, "evalIntervalSteps": 0},
        "checkpoint": {"intervalSteps": args.ckpt_every, "keep": 2},
        # A window's kills (and a fault-tolerant replica's replacements) count against backoffLimit.
        "runPolicy": {"backoffLimit": 50 if args.window else 3},
    }
    if ft:
        spec["faultTolerance"] = {"minReplicas": MIN_REPLICAS, "heartbeatTimeoutSeconds": HEARTBEAT_S}
    return {"apiVersion": "disttrain.dev/v1alpha1", "kind": "DistTrainJob",
            "metadata": {"name": name, "namespace": ns}, "spec": spec}  # fmt: skip


def stamp(text: str) -> float:
    """The runtime's RFC 3339 timestamp (nanoseconds, which fromisoformat does not take) as epoch seconds."""
    head, _, frac = text.rstrip("Z").partition(".")
    return datetime.fromisoformat(head + "+00:00").timestamp() + float("0." + (frac or "0"))


class Follow:
    """`kubectl logs -f --timestamps` of one pod's trainer, its step lines queued as they come."""

    def __init__(self, ns: str, pod: str) -> None:
        self.lines: queue.Queue[Step | None] = queue.Queue()
        self.ended = threading.Event()
        self.proc = subprocess.Popen(["kubectl", "--kubeconfig", kubeconfig(), "logs", "-f", "--timestamps",
                                      "-n", ns, pod, "-c", "trainer"], stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True)  # fmt: skip
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            m = STEP.match(line)
            if m:
                self.lines.put(Step(stamp(m.group(1)), int(m.group(2)), int(m.group(3)) if m.group(3) else None))
        self.ended.set()
        self.lines.put(None)  # the stream ended: the pod (or its container) is gone

    def next(self, timeout: float) -> Step | None:
        """The next step line; None once the stream ended, or when none came within `timeout`."""
        try:
            return self.lines.get(timeout=timeout)
        except queue.Empty:
            return None

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def pod(ns: str, name: str) -> dict[str, Any] | None:
    raw = kubectl("get", "pod", name, "-n", ns, "-o", "json", "--ignore-not-found", check=False)
    return json.loads(raw) if raw.strip() else None


def running_uid(ns: str, name: str, not_uid: str = "") -> str | None:
    """The pod's UID once it runs and is not `not_uid` (the pod it replaced), else None."""
    p = pod(ns, name)
    if p is None or p["metadata"].get("deletionTimestamp") or p["status"].get("phase") != "Running":
        return None
    return p["metadata"]["uid"] if p["metadata"]["uid"] != not_uid else None


def trainer_pids(container_id: str) -> list[int]:
    """Processes of one container, found by its id in their cgroup paths (cgroupfs driver)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if container_id in (proc / "cgroup").read_text():
                pids.append(int(proc.name))
        except OSError:  # the process ended meanwhile
            continue
    return pids


def kill_replica(ns: str, name: str, how: str) -> float:
    """Kill one replica pod's trainer; returns the time of the kill."""
    if how == "delete":
        t = time.time()
        kubectl("delete", "pod", name, "-n", ns, "--grace-period=0", "--force", "--wait=false")
        return t
    p = pod(ns, name)
    status = next((c for c in (p or {}).get("status", {}).get("containerStatuses", []) if c["name"] == "trainer"), {})
    cid = str(status.get("containerID") or "").removeprefix("containerd://")
    pids = trainer_pids(cid) if cid else []
    if not pids:
        raise RuntimeError(f"no trainer process of {ns}/{name} found on this machine (container {cid!r})")
    t = time.time()
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    return t


def wait_for_kill_step(follow: Follow, kill_at: int, replicas: int, ft: bool) -> int:
    """Read worker 0's steps until it logged `kill_at` with every replica in the quorum (a
    fault-tolerant job may start at a smaller quorum while the last pods still start)."""
    while True:
        got = follow.next(timeout=300)
        if got is None:
            raise RuntimeError(f"worker 0's log ended (or stalled) before step {kill_at}")
        if got.step >= kill_at and (not ft or got.quorum == replicas):
            return got.step


def job_status(ns: str, name: str) -> dict[str, Any]:
    raw = kubectl("get", "dtj", name, "-n", ns, "-o", "json", check=False)
    return dict(json.loads(raw).get("status") or {}) if raw.strip() else {}


def follow_ft(follow: Follow, t_kill: float, killed_at: int, seen: list[int], replicas: int,
              rejoin_timeout: float) -> dict[str, Any]:  # fmt: skip
    """The survivors after the kill: their first step at a smaller quorum, then until the quorum is
    full again (the replacement rejoined), the log ends, or `rejoin_timeout` passes."""
    first: Step | None = None
    rejoined: Step | None = None
    end = time.monotonic() + rejoin_timeout
    while rejoined is None and time.monotonic() < end:
        got = follow.next(timeout=max(0.1, end - time.monotonic()))
        if got is None:
            break
        seen.append(got.step)
        if got.t < t_kill:  # logged before the kill landed
            killed_at = max(killed_at, got.step)
        elif first is None and got.quorum is not None and got.quorum < replicas:
            first = got
        elif first is not None and got.quorum == replicas:
            rejoined = got
    if first is None:
        raise RuntimeError("the survivors logged no step at a smaller quorum after the kill")
    return {"case": "fault tolerant", "killedAtStep": killed_at, "secondsToNextStep": round(first.t - t_kill, 2),
            "stepsTrainedAgain": len(seen) - len(set(seen)), "nextStep": first.step, "quorum": first.quorum,
            "rejoinedAfterS": round(rejoined.t - t_kill, 1) if rejoined else None,
            "rejoinedAtStep": rejoined.step if rejoined else None}  # fmt: skip


def follow_gang(follow: Follow, ns: str, pod0: str, uid0: str, t_kill: float, killed_at: int) -> tuple[dict[str, Any], Follow]:
    """Gang restart: worker 0's stream ends with its pod; the restarted gang's worker 0 logs on."""
    while (got := follow.next(timeout=300)) is not None:
        if got.t < t_kill:
            killed_at = max(killed_at, got.step)
    follow.close()
    wait(f"the restarted gang's {pod0}", lambda: running_uid(ns, pod0, not_uid=uid0), 300)
    follow = Follow(ns, pod0)
    got = follow.next(timeout=300)
    if got is None:
        raise RuntimeError(f"the restarted {pod0} logged no step")
    return {"case": "gang restart", "killedAtStep": killed_at, "secondsToNextStep": round(got.t - t_kill, 2),
            "stepsTrainedAgain": max(0, killed_at - (got.step - 1)), "nextStep": got.step}, follow  # fmt: skip


def one_case(ns: str, *, ft: bool, kill_at: int, victim: int, args: argparse.Namespace) -> dict[str, Any]:
    name = f"{'ft' if ft else 'gang'}-{uuid.uuid4().hex[:5]}"
    kubectl("apply", "-f", "-", input_=json.dumps(manifest(name, ns, ft=ft, args=args)))
    pod0, victim_pod = f"{name}-worker-0", f"{name}-worker-{victim}"
    uid0 = wait(f"{pod0} running", lambda: running_uid(ns, pod0), 300)
    follow = Follow(ns, pod0)
    try:
        killed_at = wait_for_kill_step(follow, kill_at, args.replicas, ft)
        t_kill = kill_replica(ns, victim_pod, args.kill)
        if ft:
            row = follow_ft(follow, t_kill, killed_at, [killed_at], args.replicas, args.rejoin_timeout)
        else:
            row, follow = follow_gang(follow, ns, pod0, uid0, t_kill, killed_at)
        st = job_status(ns, name)
        row.update(victim=victim, phase=st.get("phase"), attempt=st.get("attempt"), restarts=st.get("restarts"),
                   replicaGroups=st.get("replicaGroups"))  # fmt: skip
        return row
    finally:
        follow.close()
        kubectl("delete", "dtj", name, "-n", ns, "--wait=false", check=False)


class StepLog:
    """Worker 0's step lines for as long as the job runs, across its pod's replacements (a gang
    restart replaces worker 0's pod too; a fault-tolerant job only the failed replica's)."""

    def __init__(self, ns: str, pod0: str) -> None:
        self.steps: list[Step] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(ns, pod0), daemon=True)
        self._thread.start()

    def _run(self, ns: str, pod0: str) -> None:
        while not self._stop.is_set():
            if not running_uid(ns, pod0):  # not yet, or deleted by a gang restart
                time.sleep(0.5)
                continue
            # Following the same pod again (its stream ended: the container died, the log rotated)
            # reads its log from the start: only lines later than the last one kept are new.
            follow = Follow(ns, pod0)
            try:
                while not self._stop.is_set():
                    got = follow.next(timeout=1.0)
                    if got is not None:
                        if not self.steps or got.t > self.steps[-1].t:
                            self.steps.append(got)
                    elif follow.ended.is_set() and follow.lines.empty():
                        break
            finally:
                follow.close()
            time.sleep(1.0)

    def last(self) -> Step | None:
        return self.steps[-1] if self.steps else None

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)


def kill_when_running(ns: str, name: str, how: str, timeout: float = 120) -> float:
    """kill_replica once the pod runs its trainer (it may still be coming back from the last kill)."""

    def attempt() -> float | None:
        if not running_uid(ns, name):
            return None
        try:
            return kill_replica(ns, name, how)
        except RuntimeError:  # between the pod's Running and its trainer's start
            return None

    return float(wait(f"{ns}/{name} running its trainer again", attempt, timeout))


def window_case(ns: str, *, ft: bool, kills: bool, rng: random.Random, args: argparse.Namespace) -> dict[str, Any]:
    """One job for args.window seconds from its step 20 (at the full quorum), a random replica other
    than 0 killed every args.kill_every seconds when `kills`; its samples kept per second."""
    from fault_tolerance import kept_samples  # noqa: PLC0415 - the local benchmark's rule, one definition

    name = f"{'ft' if ft else 'gang'}-{'kills' if kills else 'steady'}-{uuid.uuid4().hex[:5]}"
    kubectl("apply", "-f", "-", input_=json.dumps(manifest(name, ns, ft=ft, args=args)))
    log = StepLog(ns, f"{name}-worker-0")
    try:
        wait("step 20 at the full quorum", lambda: (s := log.last()) is not None and s.step >= 20
             and (not ft or s.quorum == args.replicas), 600)  # fmt: skip
        start = time.time()
        first = max(s.step for s in log.steps)
        victims: list[int] = []
        while time.time() < start + args.window:
            time.sleep(min(1.0, max(0.0, start + args.window - time.time())))
            due = start + (len(victims) + 1) * args.kill_every
            if kills and due <= time.time() < start + args.window:
                victims.append(rng.randrange(1, args.replicas))
                kill_when_running(ns, f"{name}-worker-{victims[-1]}", args.kill)
        end = time.time()
        time.sleep(15)  # kubectl logs -f delivers the window's last lines late
        recs = [{"time": s.t, "step": s.step, "quorum": s.quorum or args.replicas} for s in log.steps]
        kept = kept_samples(recs, start, end, ft=ft, batch=32, replicas=args.replicas, first_step=first)
        st = job_status(ns, name)
        return {"case": name.rsplit("-", 1)[0], "victims": victims, "windowS": round(end - start, 1),
                "keptSamplesPerS": round(kept / (end - start), 1), "attempt": st.get("attempt"),
                "restarts": st.get("restarts"), "replicaGroups": st.get("replicaGroups")}  # fmt: skip
    finally:
        log.close()
        kubectl("delete", "dtj", name, "-n", ns, "--wait=false", check=False)


def wait_for_no_pods(ns: str) -> None:
    """The previous job's pods hold CPU requests until they are gone: the next job waits for them
    (its gang is placed only when every pod fits)."""
    wait(f"no pods left in {ns}", lambda: not kubectl("get", "pods", "-n", ns, "-o", "name").strip(), 300, 1.0)


@contextmanager
def operator(ns: str) -> Iterator[Path]:
    """The operator of this checkout (not the venv's editable install) as a host process."""
    log = Path(f"/tmp/{ns}-operator.log")
    src = os.pathsep.join(str(ROOT / d) for d in ("operator", "trainer", "cli"))
    env = {**os.environ, "KUBECONFIG": kubeconfig(), "PYTHONPATH": src,
           # The local cluster advertises nvidia.com/gpu without GPUs (conftest.py does the same).
           "DISTTRAIN_OPERATOR_ALLOW_CPU_FALLBACK": "true"}  # fmt: skip
    with open(log, "wb") as fh:
        op = subprocess.Popen([sys.executable, "-m", "disttrain_cli", "operator", "--namespace", ns,
                               "--poll-interval", "2", "--progress-interval", "2", "--metrics-port", str(free_port())],
                              env=env, stdout=fh, stderr=subprocess.STDOUT)  # fmt: skip
        try:
            yield log
        finally:
            op.terminate()
            try:
                op.wait(timeout=30)
            except subprocess.TimeoutExpired:
                op.kill()
                op.wait()


def crd_established() -> bool:
    raw = kubectl("get", "crd", "disttrainjobs.disttrain.dev", "-o", "json", check=False)
    conds = (json.loads(raw).get("status") or {}).get("conditions") or [] if raw.strip() else []
    return any(c.get("type") == "Established" and c.get("status") == "True" for c in conds)


def table(rows: list[dict[str, Any]], replicas: int) -> str:
    out = [f"| job, {replicas} replicas | killed after step | seconds from the kill to the next step | "
           "steps trained again | after |", "| --- | --- | --- | --- | --- |"]  # fmt: skip
    for r in rows:
        if r["case"] == "fault tolerant":
            rejoin = (f"replacement rejoined {r['rejoinedAfterS']} s after the kill" if r["rejoinedAfterS"] is not None
                      else "replacement not rejoined in time")  # fmt: skip
            nxt = f"{r['secondsToNextStep']:.2f} (step {r['nextStep']} at quorum {r['quorum']})"
        else:
            rejoin = f"attempt {r['attempt']}, restarts {r['restarts']}"
            nxt = f"{r['secondsToNextStep']:.2f} (step {r['nextStep']}, the restarted gang's first)"
        out.append(f"| {r['case']} (replica {r['victim']} killed) | {r['killedAtStep']} | {nxt} | "
                   f"{r['stepsTrainedAgain']} | {rejoin} |")  # fmt: skip
    return "\n".join(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--replicas", type=int, default=4)
    p.add_argument("--cpu", default="400m", help="CPU of each replica pod (requests = limits)")
    p.add_argument("--steps", type=int, default=4000, help="more than the run needs: each job is deleted once measured")
    p.add_argument("--ckpt-every", type=int, default=50)
    p.add_argument("--kill", choices=("sigkill", "delete"), default="sigkill")
    p.add_argument("--rejoin-timeout", type=float, default=180.0)
    p.add_argument("--window", type=float, default=0.0,
                   help="seconds: measure throughput under a kill every --kill-every s instead of one kill's cost")
    p.add_argument("--kill-every", type=float, default=120.0)
    p.add_argument("--seed", type=int, default=43)
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    if args.window:
        args.steps = max(args.steps, 10**6)  # the job runs until the window ends
    rng = random.Random(args.seed)
    ns = f"ftbench-{uuid.uuid4().hex[:5]}"
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}, load average before: "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)  # fmt: skip
    kubectl("apply", "-f", str(CRD))
    wait("the CRD to be Established", crd_established, 60)
    kubectl("create", "namespace", ns)
    rows = []
    try:
        with operator(ns) as log:
            print(f"namespace {ns}, operator log {log}", flush=True)
            for ft in (True, False) if args.window else ():
                for kills in (False, True):
                    wait_for_no_pods(ns)
                    rows.append(window_case(ns, ft=ft, kills=kills, rng=rng, args=args))
                    print(json.dumps(rows[-1]), flush=True)
            for ft in (True, False) if not args.window else ():
                kill_at, victim = rng.randrange(*KILL_STEPS), rng.randrange(1, args.replicas)
                print(f"{'fault tolerant' if ft else 'gang restart'}: kill replica {victim} ({args.kill}) "
                      f"at step {kill_at} (seed {args.seed})", flush=True)  # fmt: skip
                wait_for_no_pods(ns)
                rows.append(one_case(ns, ft=ft, kill_at=kill_at, victim=victim, args=args))
                print(json.dumps(rows[-1]), flush=True)
    finally:
        kubectl("delete", "namespace", ns, "--wait=false", check=False)
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if args.window:
        by = {r["case"]: r["keptSamplesPerS"] for r in rows}
        rows.append({"case": "fractions", "faultTolerant": round(by["ft-kills"] / by["ft-steady"], 3),
                     "gangRestart": round(by["gang-kills"] / by["gang-steady"], 3)})  # fmt: skip
        print(json.dumps(rows[-1]))
    else:
        print(table(rows, args.replicas))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
