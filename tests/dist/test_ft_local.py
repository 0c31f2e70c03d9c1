"""Fault-tolerant data parallel with `disttrain local` (spec.faultTolerance): real replica processes,
the job's lighthouse, and a replica killed with SIGKILL.

- the survivors step again, at a smaller quorum, within heartbeatTimeoutSeconds + 2 s of the kill,
  no survivor trains a step twice, the replacement recovers the state of a live peer and rejoins,
  and every replica ends with the same parameters (digests and the last quorum's max difference);
- below minReplicas the job falls back to a gang restart from the checkpoint;
- without a failure four replicas give plain data parallel's parameters bit for bit (the all-reduce
  buckets laid out as plain DDP's, before and after its rebuild);
- HSDP (a replica group of two processes sharding the model with fsdp): a SIGKILL of one process
  takes its group out, the other group goes on alone, and the replaced group recovers its shards
  from the live group's processes of the same rank; without a failure it gives plain FSDP's
  parameters over the same four processes.

Steps are paced (DISTTRAIN_FAULT_STEP_SLEEP_S) so the kill lands mid-run and a replacement, which
takes seconds to start on a busy host, rejoins before the end, while the CPU stays mostly idle.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from disttrain_api import constants as C
from safetensors.torch import load_file
from subprocs import output_after_kill  # tests/dist/subprocs.py: conftest.py puts this folder on sys.path

pytestmark = pytest.mark.dist

HEARTBEAT_S = 2
PACE_S = 0.1
# Steps of a run whose replica is killed at step 15 and must rejoin: 58 s or more of paced steps
# after the kill, longer on a loaded host, whose load slows the replacement's start as much. A
# replacement imports torch and starts in seconds on an idle host; in a fresh `make test` (load
# average near 40 on 2 cores) one took about 50 s and found the run finished (300 steps, 46 s);
# in the next, 17-22 s. 900 steps outlasted `finish`'s 300 s under load (HSDP, 0.33 s a step).
REJOIN_STEPS = 600


def manifest(name: str, *, replicas: int, min_replicas: int, steps: int, ckpt_every: int, ft: bool = True,
             procs: int = 1, quorum_interval: int | None = None, fsdp: bool = False, gpus: int = 0,
             heartbeat_s: float = HEARTBEAT_S) -> str:  # fmt: skip
    """procs > 1 (or fsdp): HSDP, each replica group `procs` processes sharding the model (dataStrategy
    fsdp). quorum_interval None: the default (a quorum every 10 committed steps)."""
    every = f", quorumIntervalSteps: {quorum_interval}" if quorum_interval is not None else ""
    block = (f"  faultTolerance: {{minReplicas: {min_replicas}, heartbeatTimeoutSeconds: {heartbeat_s}{every}}}\n"
             if ft else "")  # fmt: skip
    if procs > 1 or fsdp:
        block += "  parallelism: {dataStrategy: fsdp}\n"
    resources = f", resources: {{gpus: {gpus}}}" if gpus else ""
    batch = 32 * replicas * procs
    return f"""\
apiVersion: disttrain.dev/v1alpha1
kind: DistTrainJob
metadata: {{name: {name}}}
spec:
  mode: data
  workers: {{replicas: {replicas}, procsPerWorker: {procs}{resources}}}
  model: {{name: mlp, hidden: 32, layers: 2}}
  data: {{name: digits, batchSize: {batch}, seed: 3, shards: 3}}
  optimizer: {{name: sgd, lr: 0.1, momentum: 0.9, baseBatchSize: {batch}, warmupSteps: 5}}
  training: {{steps: {steps}, logIntervalSteps: 1}}
  checkpoint: {{intervalSteps: {ckpt_every}, keep: 2}}
  runPolicy: {{backoffLimit: 3}}
{block}"""


def start(tmp: Path, text: str, name: str, *, pace_s: float) -> tuple[subprocess.Popen[str], Path]:
    path = tmp / f"{name}.yaml"
    path.write_text(text)
    run_dir = tmp / name
    env = {**os.environ, C.ENV_FAULT_STEP_SLEEP: str(pace_s), C.ENV_DATA_CACHE: str(tmp.parent / "disttrain-test-data")}
    proc = subprocess.Popen([sys.executable, "-m", "disttrain_cli", "local", str(path), "--run-dir", str(run_dir),
                             "--fresh", "--no-progress", "--metrics-port", "0"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    return proc, run_dir


def records(run_dir: Path, rank: int) -> list[dict[str, Any]]:
    try:
        lines = (run_dir / f"metrics-rank{rank}.jsonl").read_text().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        try:
            out.append(json.loads(line))
        except ValueError:
            continue  # the line being written
    return out


def step_of(run_dir: Path, rank: int = 0) -> int:
    steps = [r["step"] for r in records(run_dir, rank) if "event" not in r]
    return steps[-1] if steps else 0


def survivor_steps(run_dir: Path, rank: int, steps: int) -> list[dict[str, Any]]:
    """A survivor's step records, checked: none trained twice, the last one `steps`. A survivor may
    skip steps only by recovering them from a live peer: on a loaded host its heartbeat or its
    all-reduce can miss the 2 s timeout once (a replacement healing from it for 17 s did), the
    lighthouse then forms a quorum without it, and it catches up from that quorum's replicas."""
    seen = records(run_dir, rank)
    trained = [r for r in seen if "event" not in r]
    numbers = [r["step"] for r in trained]
    assert numbers and numbers == sorted(set(numbers)) and numbers[-1] == steps, \
        f"survivor {rank} trained a step twice, or did not end at step {steps}: {numbers}"
    recovered = {r["step"] for r in seen if r.get("event") == "recovered"}
    skips = [(a, b) for a, b in zip([0, *numbers], numbers) if b != a + 1]
    assert all(b - 1 in recovered for _, b in skips), f"survivor {rank} skipped steps it did not recover: {skips}"
    return trained


def pids_of(run_dir: Path) -> dict[int, int]:
    """{process rank: pid} as the launcher lists them now (pids.json: a replacement's once it started)."""
    return {int(rank): int(pid) for rank, pid in json.loads((run_dir / "pids.json").read_text())["pids"].items()}


def kill_at(proc: subprocess.Popen[str], run_dir: Path, *, rank: int, step: int) -> tuple[float, dict[int, int]]:
    """SIGKILL the replica `rank` once replica 0 logged `step`; returns when (time.time()) and every
    process's pid as listed just before the kill (the dead ones, to tell their replacements by)."""
    deadline = time.monotonic() + 240
    while step_of(run_dir) < step:
        assert proc.poll() is None, proc.communicate()[0][-3000:]
        assert time.monotonic() < deadline, "the run never reached the step of the kill"
        time.sleep(0.05)
    before = pids_of(run_dir)
    os.kill(before[rank], signal.SIGKILL)
    return time.time(), before


def stop_replacements(proc: subprocess.Popen[str], run_dir: Path, *, dead: dict[int, int],
                      deadline: float) -> dict[int, int]:  # fmt: skip
    """SIGSTOP the replacements of the killed processes `dead` ({rank: its pid before the kill}) as
    soon as the launcher started them (their pids in pids.json differ from the dead ones'); returns
    {rank: pid}. A local replacement is forked from the launcher's forkserver and can be back within
    the heartbeat timeout, before any survivor steps without it; a replacement pod takes far longer.
    This is that slow start, for real (SIGCONT ends it)."""
    held: dict[int, int] = {}
    try:
        for rank in dead:
            while (pid := pids_of(run_dir)[rank]) == dead[rank]:
                assert proc.poll() is None and time.monotonic() < deadline, f"rank {rank} was never replaced"
                time.sleep(0.02)
            os.kill(pid, signal.SIGSTOP)
            held[rank] = pid
    except BaseException:
        for pid in held.values():
            os.kill(pid, signal.SIGCONT)
        raise
    return held


def wait_for_quorum(proc: subprocess.Popen[str], run_dir: Path, *, after: float, quorum: int, deadline: float) -> None:
    """Until replica 0 logged a step trained at `quorum` after time `after` (not only the quorum's event)."""
    while not [r for r in records(run_dir, 0) if "event" not in r and r["time"] > after and r.get("quorum") == quorum]:
        assert proc.poll() is None and time.monotonic() < deadline, f"replica 0 never stepped at quorum {quorum}"
        time.sleep(0.05)


def hold_replacement(proc: subprocess.Popen[str], run_dir: Path, *, dead: dict[int, int], killed: float,
                     quorum: int) -> None:  # fmt: skip
    """Keep the replacements of the killed processes `dead` ({rank: pid}) stopped until replica 0
    has stepped at quorum `quorum` (without them), then let them go on."""
    deadline = time.monotonic() + 120
    held = stop_replacements(proc, run_dir, dead=dead, deadline=deadline)
    try:
        wait_for_quorum(proc, run_dir, after=killed, quorum=quorum, deadline=deadline)
    finally:
        for pid in held.values():
            os.kill(pid, signal.SIGCONT)


def finish(proc: subprocess.Popen[str]) -> str:
    out, _ = proc.communicate(timeout=600)  # (pytest's own timeout: 900 s)
    assert proc.returncode == 0, out[-4000:]
    return out


def replicas_agree(run_dir: Path, replicas: int, steps: int) -> list[dict[str, Any]]:
    ends = [json.loads((run_dir / f"replica{i}.json").read_text()) for i in range(replicas)]
    assert {e["step"] for e in ends} == {steps}
    assert len({e["paramsSha256"] for e in ends}) == 1, ends  # identical parameters, checked bit for bit
    assert all(e["replicaMaxAbsDiff"] == 0.0 for e in ends if e["replicaMaxAbsDiff"] is not None)
    return ends


def test_a_killed_replica_leaves_a_smaller_quorum_then_rejoins(tmp_path: Path) -> None:
    # REJOIN_STEPS paced steps: a replacement that is slow to start on a loaded host still rejoins
    # before the survivors finish. With a quorum every 10 steps (the default) the survivors' failed
    # step still asks for one at once (the same bound), and the replacement joins at the next
    # multiple of 10.
    steps = REJOIN_STEPS
    proc, run_dir = start(tmp_path, manifest("ftkill", replicas=3, min_replicas=2, steps=steps, ckpt_every=100),
                          "ftkill", pace_s=PACE_S)  # fmt: skip
    killed, before = kill_at(proc, run_dir, rank=1, step=15)
    hold_replacement(proc, run_dir, dead={1: before[1]}, killed=killed, quorum=2)
    out = finish(proc)
    assert "replica 1 lost" in out and "the other 2 go on at a smaller quorum" in out, out[-3000:]
    assert "replica 1 rejoined" in out, out[-3000:]
    for survivor in (0, 2):
        steps_seen = survivor_steps(run_dir, survivor, steps)
        smaller = [r for r in steps_seen if r["time"] > killed and r["quorum"] == 2]
        assert smaller, "the survivors never trained at the smaller quorum"
        # heartbeatTimeoutSeconds + 2 s, plus what the host's load adds: ten of the survivor's own steps
        # (their pace aside) at the speed the host gave it just before the kill (~0.1 s in all, idle).
        before = [r["step_s"] for r in steps_seen if r["time"] <= killed][-10:]
        slowdown = 10 * sorted(before)[len(before) // 2] if before else 0.0
        took = smaller[0]["time"] - killed
        assert took <= HEARTBEAT_S + 2 + slowdown, f"survivor {survivor} stepped again after {took:.1f} s " \
            f"(allowed {HEARTBEAT_S + 2 + slowdown:.1f} s, load average {os.getloadavg()[0]:.0f})"
        assert any(r["time"] > smaller[0]["time"] and r["quorum"] == 3 for r in steps_seen), "the replacement never rejoined"
    ends = replicas_agree(run_dir, 3, steps)
    assert ends[1]["recoveries"] >= 1  # from a live peer, not from the checkpoint
    local = json.loads((run_dir / "local-summary.json").read_text())
    assert local["restarts"] == 1 and local["status"] == "Succeeded"


def test_two_killed_replicas_rejoin_one_by_one_and_the_first_trains_in_the_quorum_it_joined(tmp_path: Path) -> None:
    # Four replicas, a quorum every step: replicas 1 and 2 killed together, the survivors go on at 2;
    # replica 1's replacement comes back first and completes no quorum (3 of 4). It recovers in the
    # survivors' step quorum and must train that step with them: had it asked the lighthouse again,
    # the survivors would wait for it in the step's all-reduce until heartbeatTimeoutSeconds voted
    # the step down (one discarded step at the rejoin, in their records). Then replica 2 comes back.
    steps = REJOIN_STEPS
    proc, run_dir = start(tmp_path, manifest("ftkill2", replicas=4, min_replicas=2, steps=steps, ckpt_every=100,
                                             quorum_interval=1), "ftkill2", pace_s=PACE_S)  # fmt: skip
    killed, before = kill_at(proc, run_dir, rank=1, step=15)
    os.kill(before[2], signal.SIGKILL)
    deadline = time.monotonic() + 180
    held = stop_replacements(proc, run_dir, dead={rank: before[rank] for rank in (1, 2)}, deadline=deadline)
    try:
        wait_for_quorum(proc, run_dir, after=killed, quorum=2, deadline=deadline)
        os.kill(held.pop(1), signal.SIGCONT)
        wait_for_quorum(proc, run_dir, after=killed, quorum=3, deadline=deadline)
    finally:
        for pid in held.values():
            os.kill(pid, signal.SIGCONT)
    out = finish(proc)
    assert "replica 1 rejoined" in out and "replica 2 rejoined" in out, out[-3000:]
    for survivor in (0, 3):
        steps_seen = [r for r in survivor_steps(run_dir, survivor, steps) if r["time"] > killed]
        quorums = [r["quorum"] for r in steps_seen]
        assert 2 in quorums and 3 in quorums and quorums[-1] == 4, quorums
        i = quorums.index(3)  # the first step with replica 1 back
        before, at = steps_seen[i - 1], steps_seen[i]
        assert before["quorum"] == 2 and at["discarded"] == before["discarded"], \
            f"survivor {survivor} discarded a step when replica 1 rejoined: {before} -> {at}"
    ends = replicas_agree(run_dir, 4, steps)
    assert ends[1]["recoveries"] >= 1 and ends[2]["recoveries"] >= 1
    local = json.loads((run_dir / "local-summary.json").read_text())
    assert local["restarts"] == 2 and local["status"] == "Succeeded"


@pytest.mark.parametrize("procs", [1, 2], ids=["ddp", "hsdp"])
def test_below_min_replicas_the_gang_restarts_from_the_checkpoint(tmp_path: Path, procs: int) -> None:
    # HSDP: every group loads the whole checkpoint into its shards (the step its group rank 0 found).
    steps = 40
    proc, run_dir = start(tmp_path, manifest("ftmin", replicas=2, min_replicas=2, steps=steps, ckpt_every=10,
                                             procs=procs), "ftmin", pace_s=0.05)  # fmt: skip
    kill_at(proc, run_dir, rank=procs, step=14)  # replica 1's first process
    out = finish(proc)
    assert "fewer than faultTolerance.minReplicas=2: the gang restarts from the newest checkpoint" in out, out[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["restartAttempt"] == 1 and summary["resumedFromStep"] >= 10
    assert summary["backend"] == "torchft-gloo"  # the process group's own name
    replicas_agree(run_dir, 2, steps)


def exported_pair(tmp_path: Path, names: tuple[str, str], *, procs: int, replicas: int = 2,
                  quorum_interval: int | None = None) -> tuple[dict[str, torch.Tensor], ...]:  # fmt: skip
    """The exported parameters of the same job with and without faultTolerance (no failure)."""
    runs = {}
    for name, ft in zip(names, (True, False), strict=True):
        text = manifest(name, replicas=replicas, min_replicas=replicas, steps=25, ckpt_every=100, ft=ft, procs=procs,
                        quorum_interval=quorum_interval)  # fmt: skip
        proc, run_dir = start(tmp_path, text, name, pace_s=0.0)
        finish(proc)
        runs[name] = load_file(run_dir / "checkpoints" / name / "export" / "model.safetensors")
    a, b = runs[names[0]], runs[names[1]]
    assert a.keys() == b.keys()
    moved = max(float(t.abs().max()) for t in a.values())
    assert moved > 0 and all(torch.isfinite(t).all() for t in a.values())
    return a, b


def test_without_a_failure_it_equals_plain_data_parallel(tmp_path: Path) -> None:
    # Four replicas: with two, a + b = b + a and any bucket layout gives DDP's sums; with four,
    # gloo's ring adds an element's four parts in an order set by its place in the bucket, so only
    # DDP's own layout (module order in the first step, the rebuilt one after) gives the same bits.
    # A quorum every step: the steps between two quorums (the default, every 10) train in the last
    # one, and the HSDP test below keeps the default.
    a, b = exported_pair(tmp_path, ("ftsame", "dpsame"), procs=1, replicas=4, quorum_interval=1)
    assert all(torch.equal(a[k], b[k]) for k in a), max(float((a[k] - b[k]).abs().max()) for k in a)


def test_hsdp_without_a_failure_equals_plain_fsdp(tmp_path: Path) -> None:
    # The same mean gradient, summed in another order (reduce-scatter in each group, then across
    # the groups, against one reduce-scatter over all four processes): equal up to rounding.
    a, b = exported_pair(tmp_path, ("fthsdp", "fsdpsame"), procs=2)
    assert max(float((a[k] - b[k]).abs().max()) for k in a) < 1e-5


def test_a_killed_hsdp_process_takes_its_group_out_which_rejoins_from_its_peers_shards(tmp_path: Path) -> None:
    steps, procs = REJOIN_STEPS, 2
    proc, run_dir = start(tmp_path, manifest("fthsdpkill", replicas=2, min_replicas=1, steps=steps, ckpt_every=100,
                                             procs=procs), "fthsdpkill", pace_s=PACE_S)  # fmt: skip
    killed, before = kill_at(proc, run_dir, rank=3, step=15)  # replica 1's second process
    # the launcher replaces both
    hold_replacement(proc, run_dir, dead={rank: before[rank] for rank in (2, 3)}, killed=killed, quorum=1)
    out = finish(proc)
    assert "replica 1 lost" in out and "the other 1 go on at a smaller quorum" in out, out[-3000:]
    assert "replica 1 rejoined" in out, out[-3000:]
    for survivor in (0, 1):  # replica 0's two processes
        steps_seen = survivor_steps(run_dir, survivor, steps)
        alone = [r for r in steps_seen if r["time"] > killed and r["quorum"] == 1]
        assert alone, "the surviving group never trained alone"
        assert any(r["time"] > alone[0]["time"] and r["quorum"] == 2 for r in steps_seen), "the group never rejoined"
    ends = replicas_agree(run_dir, 2, steps)  # each group's shard digests, in group rank order
    assert ends[1]["recoveries"] >= 1
    local = json.loads((run_dir / "local-summary.json").read_text())
    assert local["restarts"] == 1 and local["status"] == "Succeeded"


def test_a_stopped_hsdp_job_leaves_promptly_every_process_at_the_quorum(tmp_path: Path) -> None:
    # SIGTERM reaches every process of a group between two steps or inside one; each leaves at its
    # next wait for the quorum, or, a moment behind a group peer that left there, at the failed
    # collective with it: none fails, none hangs in a collective a group peer already left.
    proc, run_dir = start(tmp_path, manifest("fthsdpstop", replicas=2, min_replicas=1, steps=2000, ckpt_every=1000,
                                             procs=2), "fthsdpstop", pace_s=0.02)  # fmt: skip
    deadline = time.monotonic() + 240
    while step_of(run_dir) < 20:
        assert proc.poll() is None and time.monotonic() < deadline, output_after_kill(proc)[0][-3000:]
        time.sleep(0.05)
    pids = list(pids_of(run_dir).values())
    stopped = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    # Until the job's processes (the lighthouse's too) have exited, not until `disttrain local` does:
    # after them it draws the run's plot, which took 23 s of a loaded host once.
    while any(running(pid) for pid in pids) and time.monotonic() < stopped + 120:
        time.sleep(0.05)
    took = time.monotonic() - stopped
    out, _ = proc.communicate(timeout=120)
    assert "stopped by the user" in out, out[-3000:]
    for rank in range(4):
        log = (run_dir / "logs" / f"rank{rank}.log").read_text()
        assert ("stopped on request while waiting for a quorum" in log
                or "stopped on request (a process of this replica group left first" in log), log[-2000:]
        assert "Traceback" not in log, log[-3000:]
    assert took < 20, f"the processes took {took:.0f} s to leave (a collective waited on a departed peer)"


def running(pid: int) -> bool:
    """Whether process `pid` runs (a zombie its parent has not reaped yet has exited)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"
