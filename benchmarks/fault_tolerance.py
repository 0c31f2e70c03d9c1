"""What a failure costs with spec.faultTolerance, against today's gang restart, on `disttrain local`.

Each case is a real `disttrain local` run (launcher, lighthouse, one process per replica, or
--procs processes sharding it: HSDP) with a replica killed by SIGKILL (its first process); the same
job without faultTolerance (a gang of DDP or FSDP ranks) is killed the same way beside it, and the
same jobs run without kills give the reference throughput.

  cost     one kill at a random step: seconds from the kill until the surviving replicas (the
           restarted gang) take their next step; steps trained again (survivors: a step number
           logged twice; the gang: the step killed at minus the step it resumed from)
  window   throughput over a window with one kill every --kill-every seconds, as a fraction of
           the same window without kills: samples kept (fault tolerant: the quorum's samples of
           every step; gang restart: net steps, retrained ones not counted) per second
  correct  no failure: fault-tolerant DP against plain DP (max parameter difference, step cost,
           CPU per step of all the run's processes);
           one kill and a rejoin: every replica's parameters identical (sha256), final accuracy
           against the uninterrupted run
  diloco   GPT, every-step DDP against DiLoCo (interval H): validation loss at the same samples
           and the bytes moved (the runs' communication metrics); beside them one replica alone
           (the same batch per replica and steps, a quarter of the samples): what DiLoCo's
           averaging gains over not training the other replicas at all

    .venv/bin/python benchmarks/fault_tolerance.py cost --model mlp --replicas 4 [--json out.json]
    .venv/bin/python benchmarks/fault_tolerance.py window --window 240 --kill-every 60
    .venv/bin/python benchmarks/fault_tolerance.py correct [--procs 2 --replicas 2]
    DISTTRAIN_DEVICE=cuda python3 benchmarks/fault_tolerance.py correct --model gpt --replicas 1  (one GPU)
    .venv/bin/python benchmarks/fault_tolerance.py diloco --replicas 4 --interval 50 --steps 400
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from disttrain_api import constants as C
from proc_stats import tree_cpu_seconds

HEARTBEAT_S = 3


def manifest(name: str, *, model: str, replicas: int, steps: int, ft: bool, ckpt_every: int, min_replicas: int = 1,
             sync: dict[str, Any] | None = None, log_every: int = 1, eval_every: int = 0, lr: float = 0.002,
             init: Path | None = None, procs: int = 1, mlp: tuple[int, int] = (128, 2),
             quorum_interval: int | None = None, gpt_batch: int = 8, gpt: tuple[int, int] = (64, 2),
             data_seed: int = 0) -> str:  # fmt: skip
    """procs > 1: HSDP, each replica `procs` processes sharding the model (dataStrategy fsdp); the
    batch per process stays what it is with one (32 digits rows, `gpt_batch` GPT sequences). `mlp`:
    the MLP's hidden width and layers; `gpt`: the GPT's."""
    if model == "gpt":
        start = f", init: {json.dumps(str(init))}" if init else ""
        body = (f"  model: {{name: gpt, hidden: {gpt[0]}, layers: {gpt[1]}, heads: 4, blockSize: 64{start}}}\n"
                f"  data: {{name: pytext, batchSize: {gpt_batch * replicas * procs}, seed: {data_seed}}}\n"
                f"  optimizer: {{name: adamw, lr: {lr}, scaleLR: none, warmupSteps: 20, decay: cosine, minLRRatio: 0.1}}\n")  # fmt: skip
    else:
        body = (f"  model: {{name: mlp, hidden: {mlp[0]}, layers: {mlp[1]}}}\n"
                f"  data: {{name: digits, batchSize: {32 * replicas * procs}, seed: 0}}\n"
                f"  optimizer: {{name: sgd, lr: 0.1, momentum: 0.9, baseBatchSize: {32 * replicas * procs}, "
                "warmupSteps: 30}\n")  # fmt: skip
    training = f"steps: {steps}, logIntervalSteps: {log_every}, evalIntervalSteps: {eval_every}"
    if sync:
        training += f", sync: {json.dumps(sync)}"
    text = (f"apiVersion: disttrain.dev/v1alpha1\nkind: DistTrainJob\nmetadata: {{name: {name}}}\nspec:\n"
            f"  mode: data\n  workers: {{replicas: {replicas}, procsPerWorker: {procs}}}\n{body}"
            f"  training: {{{training}}}\n"
            f"  checkpoint: {{intervalSteps: {ckpt_every}, keep: 2}}\n  runPolicy: {{backoffLimit: 50}}\n")  # fmt: skip
    if ft:
        every = f", quorumIntervalSteps: {quorum_interval}" if quorum_interval is not None else ""
        text += f"  faultTolerance: {{minReplicas: 1, heartbeatTimeoutSeconds: {HEARTBEAT_S}{every}}}\n"
    if procs > 1:
        text += "  parallelism: {dataStrategy: fsdp}\n"
    return text


class Local:
    """One `disttrain local` run in a folder of its own."""

    def __init__(self, work: Path, name: str, text: str) -> None:
        self.run_dir = work / name
        path = work / f"{name}.yaml"
        path.write_text(text)
        env = {**os.environ, C.ENV_DATA_CACHE: str(work / "data")}
        self.proc = subprocess.Popen([sys.executable, "-m", "disttrain_cli", "local", str(path), "--run-dir",
                                      str(self.run_dir), "--fresh", "--no-progress", "--metrics-port", "0"],
                                     env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip

    def records(self, rank: int = 0, *, events: bool = False) -> list[dict[str, Any]]:
        """Replica `rank`'s step records (and its events: quorum, recovered, ..., with `events`)."""
        try:
            lines = (self.run_dir / f"metrics-rank{rank}.jsonl").read_text().splitlines()
        except OSError:
            return []
        out = []
        for line in lines:
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
        return out if events else [r for r in out if "event" not in r]

    def step(self) -> int:
        recs = self.records()
        return int(recs[-1]["step"]) if recs else 0

    def wait_step(self, step: int, timeout: float = 600) -> float:
        deadline = time.monotonic() + timeout
        while self.step() < step:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{self.run_dir.name} ended or stalled before step {step}: "
                                   f"{self.proc.communicate()[0][-2000:] if self.proc.poll() is not None else ''}")  # fmt: skip
            time.sleep(0.05)
        return time.time()

    def kill(self, rank: int) -> float:
        pid = int(json.loads((self.run_dir / "pids.json").read_text())["pids"][str(rank)])
        os.kill(pid, signal.SIGKILL)
        return time.time()

    def finish(self, timeout: float = 900) -> str:
        out, _ = self.proc.communicate(timeout=timeout)
        if self.proc.returncode != 0:
            raise RuntimeError(f"{self.run_dir.name} failed: {out[-3000:]}")
        return out

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.communicate(timeout=300)

    def summary(self) -> dict[str, Any]:
        return json.loads((self.run_dir / "summary.json").read_text())

    def cpu_per_step(self, first: int, last: int) -> float:
        """CPU milliseconds of all the run's processes (the launcher, its trainers and the lighthouse;
        user + system, every thread) per training step, between steps `first` and `last` (steady
        state: no start-up imports, no end)."""
        self.wait_step(first)
        s0, c0 = self.step(), tree_cpu_seconds(self.proc.pid)
        self.wait_step(last)
        s1, c1 = self.step(), tree_cpu_seconds(self.proc.pid)
        return 1000 * (c1 - c0) / max(1, s1 - s0)


def first_step_after(recs: list[dict[str, Any]], t: float) -> dict[str, Any] | None:
    return next((r for r in recs if r["time"] > t), None)


def one_kill(work: Path, *, model: str, replicas: int, ft: bool, steps: int, at: int, victim: int,
             procs: int = 1, quorum_interval: int | None = None) -> dict[str, Any]:  # fmt: skip
    """Replica `victim` killed (its first process, SIGKILL) once replica 0 logged step `at`."""
    name = f"{'ft' if ft else 'gang'}-{model}-cost"
    run = Local(work, name, manifest(name, model=model, replicas=replicas, steps=steps, ft=ft, ckpt_every=50,
                                     procs=procs, quorum_interval=quorum_interval))  # fmt: skip
    run.wait_step(at)
    killed = run.kill(victim * procs)
    before = run.records()
    step_at_kill = int(before[-1]["step"]) if before else 0
    resumed_at = killed
    if not ft:  # the restarted gang: its processes appear in pids.json with the next attempt
        while json.loads((run.run_dir / "pids.json").read_text()).get("attempt", 0) < 1:
            time.sleep(0.02)
        resumed_at = time.time()
    run.finish()
    recs = run.records()
    if ft:  # the survivors' first step in a quorum formed after the kill: at the smaller quorum, or at
        # the full one if the replacement joined it. (A step logged just after the kill whose all-reduce
        # had the killed replica's part is not one: at most one such step, trained before the kill.)
        quorum = next((r["time"] for r in run.records(events=True)
                       if r.get("event") == "quorum" and r["time"] > killed), killed)  # fmt: skip
        nxt = first_step_after(recs, quorum)
    else:
        nxt = first_step_after(recs, resumed_at)
    assert nxt is not None, recs[-5:]
    numbers = [int(r["step"]) for r in recs]
    if ft:
        again = len(numbers) - len(set(numbers))
    else:  # the new attempt's first logged step minus one is where it resumed from
        again = max(0, step_at_kill - (int(nxt["step"]) - 1))
    return {"case": name, "killedAtStep": step_at_kill, "secondsToNextStep": round(nxt["time"] - killed, 2),
            "stepsTrainedAgain": again, "nextStep": int(nxt["step"]), "quorumAtNextStep": nxt.get("quorum")}  # fmt: skip


def cost(args: argparse.Namespace, work: Path) -> list[dict[str, Any]]:
    rng = random.Random(args.seed)
    out = []
    for ft in (True, False):
        at = rng.randrange(60, 140)
        victim = rng.randrange(1, args.replicas)
        out.append(one_kill(work, model=args.model, replicas=args.replicas, ft=ft, steps=args.steps, at=at,
                            victim=victim, procs=args.procs, quorum_interval=args.quorum_interval))  # fmt: skip
        print(json.dumps(out[-1]), flush=True)
    return out


def kept_samples(recs: list[dict[str, Any]], start: float, end: float, *, ft: bool, batch: int, replicas: int,
                 first_step: int) -> float:  # fmt: skip
    """Samples trained and kept within [start, end]: the quorum's of every step (fault tolerant), or
    net steps x global batch (gang restart: steps trained again do not count)."""
    inside = [r for r in recs if start <= r["time"] <= end]
    if ft:
        return sum(int(r.get("quorum", replicas)) * batch for r in inside)
    last = max((int(r["step"]) for r in inside), default=first_step)
    return (last - first_step) * batch * replicas


def window(args: argparse.Namespace, work: Path) -> list[dict[str, Any]]:
    rng = random.Random(args.seed)
    per_replica = args.gpt_batch if args.model == "gpt" else 32
    out = []
    for ft in (True, False):
        for kills in (False, True):
            name = f"{'ft' if ft else 'gang'}-{'kills' if kills else 'steady'}"
            run = Local(work, name, manifest(name, model=args.model, replicas=args.replicas, steps=10**6, ft=ft,
                                             ckpt_every=args.ckpt_every, quorum_interval=args.quorum_interval,
                                             gpt_batch=args.gpt_batch))  # fmt: skip
            run.wait_step(20)  # past start-up, the same point for every case
            start = time.time()
            first = run.step()
            n = 0
            while time.time() < start + args.window:
                time.sleep(min(1.0, start + args.window - time.time()))
                if kills and time.time() >= start + (n + 1) * args.kill_every and time.time() < start + args.window:
                    run.kill(rng.randrange(1, args.replicas) if ft else rng.randrange(0, args.replicas))
                    n += 1
            end = time.time()
            run.stop()
            kept = kept_samples(run.records(), start, end, ft=ft, batch=per_replica, replicas=args.replicas,
                                first_step=first)  # fmt: skip
            out.append({"case": name, "kills": n, "windowS": round(end - start, 1), "keptSamplesPerS": kept / (end - start)})
            print(json.dumps(out[-1]), flush=True)
    by = {o["case"]: o["keptSamplesPerS"] for o in out}
    out.append({"case": "fractions", "faultTolerant": by["ft-kills"] / by["ft-steady"],
                "gangRestart": by["gang-kills"] / by["gang-steady"]})  # fmt: skip
    print(json.dumps(out[-1]), flush=True)
    return out


def correct(args: argparse.Namespace, work: Path) -> list[dict[str, Any]]:
    from safetensors.torch import load_file

    out = []
    steps = args.steps
    exports: dict[str, Any] = {}
    rates: dict[str, list[float]] = {"plain": [], "ft": []}
    cpu: dict[str, list[float]] = {"plain": [], "ft": []}
    # Rounds alternate the two jobs, so a change in the host's load (other work on a shared VM) falls
    # on both; the figures are the medians of the rounds' ratios.
    for rnd in range(args.rounds):
        for name, ft in (("plain", False), ("ft", True)):
            job = f"{name}{rnd}"  # a run folder of its own: the next round's waits must not read this one's steps
            run = Local(work, job, manifest(job, model=args.model, replicas=args.replicas, steps=steps, ft=ft,
                                            ckpt_every=steps, log_every=10, procs=args.procs, mlp=args.mlp,
                                            gpt=args.gpt, gpt_batch=args.gpt_batch,
                                            quorum_interval=args.quorum_interval))  # fmt: skip
            cpu[name].append(run.cpu_per_step(steps // 4, 3 * steps // 4))
            run.finish()
            if rnd == 0:
                exports[name] = load_file(run.run_dir / "checkpoints" / job / "export" / "model.safetensors")
            recs = run.records()[2:]  # steady state
            rates[name].append(sum(r["samples_per_s"] * r["steps"] for r in recs) / max(1, sum(r["steps"] for r in recs)))
            out.append({"case": name, "round": rnd, "testAccuracy": run.summary().get("testAccuracy"),
                        "valLoss": run.summary().get("valLoss"), "samplesPerSPerRank": rates[name][-1],
                        "cpuMsPerStep": round(cpu[name][-1], 2)})  # fmt: skip
            print(json.dumps(out[-1]), flush=True)
    diff = max(float((exports["ft"][k] - exports["plain"][k]).abs().max()) for k in exports["ft"])
    cost = [f / p for f, p in zip(rates["ft"], rates["plain"], strict=True)]
    cpu_ratio = [f / p for f, p in zip(cpu["ft"], cpu["plain"], strict=True)]
    out.append({"case": "ft vs plain", "maxParamDiff": diff, "stepCostRatio": statistics.median(cost),
                "cpuPerStepRatio": statistics.median(cpu_ratio), "stepCostRatios": [round(c, 3) for c in cost],
                "cpuMsPerStep": {k: round(statistics.median(v), 2) for k, v in cpu.items()}})  # fmt: skip
    print(json.dumps(out[-1]), flush=True)
    if args.replicas < 2:  # (a machine with one GPU: one replica) no live peer to rejoin from
        return out
    name = "ft-kill"
    run = Local(work, name, manifest(name, model=args.model, replicas=args.replicas, steps=steps, ft=True,
                                     ckpt_every=steps, log_every=10, procs=args.procs, mlp=args.mlp,
                                     quorum_interval=args.quorum_interval))  # fmt: skip
    run.wait_step(steps // 4)
    run.kill(args.procs)  # replica 1's first process
    run.finish()
    digests = {json.loads(p.read_text())["paramsSha256"] for p in run.run_dir.glob("replica*.json")}
    s = run.summary()
    acc, loss = s.get("testAccuracy"), s.get("valLoss")
    row: dict[str, Any] = {"case": name, "replicasIdentical": len(digests) == 1, "testAccuracy": acc, "valLoss": loss}
    if acc is not None:
        row["accuracyPointsBelowUninterrupted"] = round(100 * (out[1]["testAccuracy"] - acc), 2)
    else:
        row["valLossVsUninterrupted"] = loss / out[1]["valLoss"]  # (out[1]: the first round's ft run)
    out.append(row)
    print(json.dumps(out[-1]), flush=True)
    return out


def diloco(args: argparse.Namespace, work: Path) -> list[dict[str, Any]]:
    out = []
    outer = {"name": args.outer, "lr": args.outer_lr, "momentum": args.outer_momentum}
    init = None
    if args.pretrain:  # the DiLoCo paper's setting: both continue from the same pretrained weights
        pre = Local(work, "pretrain", manifest("pretrain", model="gpt", replicas=args.replicas, steps=args.pretrain,
                                               ft=False, ckpt_every=args.pretrain, log_every=args.interval,
                                               gpt_batch=args.gpt_batch, gpt=args.gpt, data_seed=args.data_seed))  # fmt: skip
        pre.finish()
        init = pre.run_dir / "checkpoints" / "pretrain" / "export"
        out.append({"case": "pretrain", "steps": args.pretrain, "valLoss": pre.summary().get("valLoss")})
        print(json.dumps(out[-1]), flush=True)
    diloco_sync = {"kind": "diloco", "interval": args.interval, "outerOptimizer": outer,
                   "everyStepFirst": args.every_step_first}
    # (case, replicas, sync): one replica alone trains on a quarter of the samples (with 4 replicas).
    cases = [] if args.diloco_only else [("every-step", args.replicas, None)]
    cases.append(("diloco", args.replicas, diloco_sync))
    if not args.diloco_only:
        cases.append(("one replica", 1, None))
    for name, replicas, sync in cases:
        run = Local(work, name.replace(" ", "-"),
                    manifest(name.replace(" ", "-"), model="gpt", replicas=replicas, steps=args.steps, ft=False,
                             ckpt_every=args.steps, sync=sync, log_every=args.interval,
                             lr=args.inner_lr if sync else 0.002, init=init, gpt_batch=args.gpt_batch, gpt=args.gpt,
                             data_seed=args.data_seed))  # fmt: skip
        run.finish()
        s = run.summary()
        moved = sum(r["gradient_bytes"] * r["steps"] for r in run.records())
        out.append({"case": name, "valLoss": s.get("valLoss"), "commBytes": s.get("commBytes"),
                    "gradientBytesMetric": moved, "trainS": round(s.get("trainS", 0.0), 1),
                    "commExposedFraction": s.get("commExposedFraction")})  # fmt: skip
        print(json.dumps(out[-1]), flush=True)
    by = {o["case"]: o for o in out}
    if "every-step" not in by:
        return out
    a, b, one = by["every-step"], by["diloco"], by["one replica"]
    out.append({"case": "diloco vs every-step", "valLossRatio": b["valLoss"] / a["valLoss"],
                "bytesRatio": a["gradientBytesMetric"] / b["gradientBytesMetric"],
                "oneReplicaVsEveryStep": one["valLoss"] / a["valLoss"]})  # fmt: skip
    print(json.dumps(out[-1]), flush=True)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=("cost", "window", "correct", "diloco"))
    p.add_argument("--model", choices=("mlp", "gpt"), default="mlp")
    p.add_argument("--mlp", type=lambda v: tuple(int(x) for x in v.split("x")), default=(128, 2),
                   help="correct: the MLP's width x layers (default 128x2, the digits example's)")
    p.add_argument("--replicas", type=int, default=4)
    p.add_argument("--gpt", type=lambda v: tuple(int(x) for x in v.split("x")), default=(64, 2),
                   help="diloco, correct: the GPT's width x layers (default 64x2, gpt-tokens.yaml's; 128x4 is the pipeline, "
                        "tensor and hybrid examples')")
    p.add_argument("--gpt-batch", type=int, default=8, help="GPT sequences per replica and step (window, correct, diloco)")
    p.add_argument("--procs", type=int, default=1, help="processes per replica: > 1 is HSDP (dataStrategy fsdp)")
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--window", type=float, default=600.0)
    p.add_argument("--kill-every", type=float, default=120.0)
    p.add_argument("--ckpt-every", type=int, default=100)
    p.add_argument("--interval", type=int, default=50)
    p.add_argument("--outer", choices=("nesterov", "sgd"), default="nesterov")
    p.add_argument("--outer-lr", type=float, default=0.7)
    p.add_argument("--outer-momentum", type=float, default=0.9)
    p.add_argument("--pretrain", type=int, default=0, help="diloco: steps of every-step DDP both runs start from")
    p.add_argument("--inner-lr", type=float, default=0.002, help="diloco's inner AdamW lr (every-step: 0.002)")
    p.add_argument("--diloco-only", action="store_true", help="skip the every-step reference (a sweep)")
    p.add_argument("--every-step-first", type=int, default=0,
                   help="diloco: training.sync.everyStepFirst (DDP steps before the replicas step apart)")
    p.add_argument("--rounds", type=int, default=1, help="correct: plain and fault-tolerant runs, alternated")
    p.add_argument("--quorum-interval", type=int, default=None,
                   help="spec.faultTolerance.quorumIntervalSteps of the fault-tolerant jobs (default: unset, 10)")
    p.add_argument("--seed", type=int, default=43)
    p.add_argument("--data-seed", type=int, default=0, help="diloco: the jobs' data.seed (their shuffle and init)")
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-ft-") as tmp:
        out = {"cost": cost, "window": window, "correct": correct, "diloco": diloco}[args.what](args, Path(tmp))
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
