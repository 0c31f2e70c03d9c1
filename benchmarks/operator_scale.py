"""Operator scale benchmark: N DistTrainJobs x W workers with a trivial worker command.

Measures, on a real cluster (KUBECONFIG, else the local cluster's kubeconfig):
- apply-to-all-pods-created latency per job (p50/p95): from the create call of the
  job to the moment a pod watch has seen all W of its pods (objects created, not
  necessarily running: this is the operator's latency, not the kubelets');
- apply-to-Succeeded for the whole batch (pods run `sleep`, then exit 0);
- the operator's CPU seconds and peak RSS (it runs as a host process: /proc; on the local
  cluster in a CPU cgroup beside the nodes', with a node's weight: `join_cluster_cgroup`);
- API requests per job: the operator's own client requests (its
  disttrain_operator_api_requests_total counter, also by verb and resource; kopf's
  watch streams are not in it) and the apiserver's apiserver_request_total
  delta over the run (every client: kubelets, scheduler, controllers, kopf).
- status writes per job, counted at the API server (a watch on the jobs: benchmarks/
  status_writes.py): over a job's life, and per minute while it runs, progress-only ones
  apart, against the design cap of one progress write per job per 10 s whatever the number
  of workers. Worker 0 of each job serves a metrics page whose disttrain_step advances twice a
  second for --run-seconds (the others sleep as long), so the operator always has a progress
  change pending; --run-seconds 0 gives every pod `sleep 2` as before (no progress).
- the plain-client reference, in the same run and before the operator's part: the very
  same objects (each job's ConfigMap, headless Service and W pods, built by the
  operator's own builders, owner references dropped) created with a plain kubernetes
  client from 16 threads in a namespace of their own; the ratio operator / reference of
  the time until all pods exist is the operator's overhead over the API server's speed.

    .venv/bin/python benchmarks/operator_scale.py --jobs 50 --workers 4
    .venv/bin/python benchmarks/operator_scale.py --jobs 500 --workers 1   # memory, CPU at scale
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

from proc_stats import cpu_seconds, peak_rss_mb
from status_writes import StatusWriteWatch, summarize, worker_command

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "operator"))


def default_kubeconfig() -> str:
    return os.environ.get("KUBECONFIG") or local_kubeconfig()


def local_kubeconfig() -> str:
    cache = Path(os.environ.get("DISTTRAIN_CACHE", Path.home() / ".cache" / "disttrain"))
    return str(cache / "cluster" / "kubeconfig")


def join_cluster_cgroup(pid: int) -> Path | None:
    """Put the operator beside the local cluster's nodes for CPU: in a cgroup of its own under the
    cluster's (hack/localcluster: cgroup v1, where the cluster weighs as much as 8 host processes
    so that the suite's host processes cannot starve its pods), with a node's weight. As a host
    process it would weigh 1/9 of the busy cluster while 200 containers start, which no operator
    pod in a real cluster does. None where there is no such cgroup (another cluster, cgroup v2)."""
    sys.path.insert(0, str(ROOT / "hack"))
    from localcluster.config import CGROUP_PARENT  # type: ignore[import-not-found]  # noqa: PLC0415

    parent = Path("/sys/fs/cgroup/cpu") / CGROUP_PARENT
    if not (parent / "cgroup.procs").exists():
        return None
    own = parent / "operator-bench"
    own.mkdir(exist_ok=True)
    (own / "cpu.shares").write_text("1024")  # cgroup v1's default: what each node and the control plane have
    (own / "cgroup.procs").write_text(str(pid))
    return own


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape_sum(text: str, name: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


THREADS = 16  # the benchmark's own create calls, and the plain-client reference


def scrape_by_label(text: str, name: str, labels: tuple[str, ...]) -> dict[str, float]:
    """Sum of a counter's samples grouped by the values of `labels` ("verb resource")."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith(name + "{"):
            continue
        series, value = line.rsplit(" ", 1)
        pairs = dict(part.split("=", 1) for part in series[len(name) + 1:-1].split(",") if "=" in part)
        key = " ".join(pairs.get(label, "").strip('"') for label in labels)
        out[key] = out.get(key, 0.0) + float(value)
    return out


def reference_objects(name: str, ns: str, workers: int, image: str, **job: Any) -> list[dict[str, Any]]:
    """The ConfigMap, headless Service and pods the operator creates for job_body(...),
    from its own builders, without owner references (no job owns them here)."""
    from disttrain_api.validation import load_job
    from disttrain_operator import topology
    from disttrain_operator.topology.common import BuildContext

    spec = load_job(job_body(name, ns, workers, image, **job)).spec
    children = topology.build_children(spec, BuildContext(name=name, namespace=ns, image=image, replicas=workers))
    objs = [*children.config_maps, *children.services, *children.pods]
    for obj in objs:
        obj["metadata"].pop("ownerReferences", None)
    return objs


def plain_client_reference(core: Any, ns: str, jobs: int, workers: int, image: str, **job: Any) -> dict[str, float]:
    """Seconds until every object of every job exists, created by a plain client from THREADS
    threads (each create returns once the object is stored: a pod exists when its call returns)."""
    from kubernetes import client

    cfg = client.Configuration.get_default_copy()
    cfg.connection_pool_maxsize = THREADS
    api = client.CoreV1Api(client.ApiClient(cfg))
    create = {"ConfigMap": api.create_namespaced_config_map, "Service": api.create_namespaced_service,
              "Pod": api.create_namespaced_pod}
    objs = [(i, o) for i in range(jobs) for o in reference_objects(f"ref-{i:03d}", ns, workers, image, **job)]
    done: dict[int, float] = {}  # job -> when its last object was stored
    guard = threading.Lock()

    def make(item: tuple[int, dict[str, Any]]) -> None:
        create[item[1]["kind"]](ns, item[1])
        with guard:
            done[item[0]] = max(done.get(item[0], 0.0), time.monotonic())

    t0 = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(max_workers=THREADS) as pool:
        list(pool.map(make, objs))
    # Per job, from the start of the batch (every job "arrives" at once, as in the operator's
    # burst): what the same objects' creation alone costs a job at its place in the batch.
    per_job = [t - t0 for t in done.values()]
    return {"objects": len(objs), "all_created_s": round(time.monotonic() - t0, 2),
            "job_p50_s": round(percentile(per_job, 0.5), 3), "job_p95_s": round(percentile(per_job, 0.95), 3)}


def job_body(name: str, ns: str, workers: int, image: str, *, run_seconds: float = 0.0,
             memory: str = "16Mi") -> dict[str, Any]:  # fmt: skip
    return {
        "apiVersion": "disttrain.dev/v1alpha1",
        "kind": "DistTrainJob",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "mode": "data",
            "image": image,
            "workers": {
                "replicas": workers,
                "resources": {"cpu": "10m", "memory": memory},
                "template": {"containers": [{"name": "trainer", "command": worker_command(run_seconds)}]},
            },
            "data": {"batchSize": 64 * workers},
            "runPolicy": {"cleanPodPolicy": "None"},
        },
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=50)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--image", default="disttrain-trainer:dev")
    ap.add_argument("--poll-interval", type=float, default=3.0)
    ap.add_argument("--run-seconds", type=float, default=60.0,
                    help="how long the pods run; worker 0 serves an advancing step meanwhile (0: `sleep 2`, "
                    "no progress)")
    ap.add_argument("--memory", default=None, help="each pod's memory (default 32Mi with --run-seconds, "
                    "python3 serving rank 0's page; 16Mi for `sleep 2`)")
    ap.add_argument("--timeout", type=float, default=900.0, help="give up waiting for Succeeded after this")
    ap.add_argument("--kubeconfig", default=default_kubeconfig())
    ap.add_argument("--json", type=Path, help="also write the results here")
    ap.add_argument("--no-reference", action="store_true", help="skip the plain-client reference")
    ap.add_argument("--apply-threads", type=int, default=THREADS,
                    help="threads applying the jobs (1: one after the other, each job's latency then "
                    "measures the operator, not a queue of jobs that all arrived at once)")
    ap.add_argument("--settle-load", type=float, default=4.0,
                    help="first wait (up to 5 min) until the 1-minute load average is below this: the "
                    "pods of a previous run are still being torn down for a minute or two after it")
    args = ap.parse_args(argv)
    job_opts = {"run_seconds": args.run_seconds, "memory": args.memory or ("32Mi" if args.run_seconds > 0 else "16Mi")}
    deadline = time.monotonic() + 300
    while os.getloadavg()[0] >= args.settle_load and time.monotonic() < deadline:
        time.sleep(5)
    print(f"load average at start: {os.getloadavg()[0]:.1f}", flush=True)

    from kubernetes import client, config, watch

    config.load_kube_config(args.kubeconfig)
    core, custom = client.CoreV1Api(), client.CustomObjectsApi()
    env = {**os.environ, "KUBECONFIG": args.kubeconfig}
    subprocess.run(["kubectl", "apply", "-f", str(ROOT / "manifests/crd/disttrainjobs.yaml")], env=env,
                   check=True, capture_output=True)
    reference: dict[str, float] = {}
    if not args.no_reference:
        ref_ns = f"bench-ref-{uuid.uuid4().hex[:6]}"
        core.create_namespace({"metadata": {"name": ref_ns}})
        try:
            reference = plain_client_reference(core, ref_ns, args.jobs, args.workers, args.image, **job_opts)
        finally:
            # Gone before the operator's part starts: its deletions must not load that part.
            subprocess.run(["kubectl", "delete", "namespace", ref_ns, "--wait=true", "--timeout=300s"], env=env,
                           capture_output=True)
        print(f"plain-client reference: {reference}", flush=True)
    ns = f"bench-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": ns}})
    port = free_port()
    log = open(Path("/tmp") / f"operator-{ns}.log", "wb")  # noqa: SIM115
    op = subprocess.Popen(
        [str(Path(sys.executable).parent / "disttrain"), "operator", "--namespace", ns, "--metrics-port", str(port),
         "--poll-interval", str(args.poll_interval)],
        env=env, stdout=log, stderr=subprocess.STDOUT,
    )
    op_cgroup = join_cluster_cgroup(op.pid) if args.kubeconfig == local_kubeconfig() else None

    def op_metrics() -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            return r.read().decode()

    def apiserver_requests() -> float:
        raw = subprocess.run(["kubectl", "get", "--raw", "/metrics"], env=env, capture_output=True, text=True)
        return scrape_sum(raw.stdout, "apiserver_request_total") if raw.returncode == 0 else float("nan")

    try:
        for _ in range(100):
            try:
                op_metrics()
                break
            except OSError:
                time.sleep(0.2)
        time.sleep(2.0)  # kopf's watches are up
        created_at: dict[str, float] = {}
        seen: dict[str, set[str]] = {}
        all_created: dict[str, float] = {}
        stop = threading.Event()

        def watch_pods() -> None:
            w = watch.Watch()
            for ev in w.stream(core.list_namespaced_pod, ns, label_selector="disttrain.dev/job-name",
                               timeout_seconds=int(args.timeout)):
                now = time.monotonic()
                pod = ev["object"]
                job = pod.metadata.labels.get("disttrain.dev/job-name")
                seen.setdefault(job, set()).add(pod.metadata.name)
                if len(seen[job]) == args.workers and job not in all_created:
                    all_created[job] = now
                if stop.is_set() or len(all_created) == args.jobs:
                    w.stop()

        watcher = threading.Thread(target=watch_pods, daemon=True)
        watcher.start()
        status_watch = StatusWriteWatch(custom, ns)
        status_watch.start()
        time.sleep(1.0)
        cpu0, api0, t0 = cpu_seconds(op.pid), apiserver_requests(), time.monotonic()
        names = [f"scale-{i:03d}" for i in range(args.jobs)]

        def apply(name: str) -> None:
            created_at[name] = time.monotonic()
            custom.create_namespaced_custom_object("disttrain.dev", "v1alpha1", ns, "disttrainjobs",
                                                   job_body(name, ns, args.workers, args.image, **job_opts))

        # By default from as many threads as the reference uses: the jobs' own creation is not
        # serialised behind one connection, so the time until all pods exist is the operator's.
        with concurrent.futures.ThreadPoolExecutor(max_workers=args.apply_threads) as pool:
            list(pool.map(apply, names))
        apply_s = time.monotonic() - t0
        watcher.join(timeout=args.timeout)
        created_s = time.monotonic() - t0
        # Then every job to Succeeded (pods ran `sleep 2` and exited 0).
        deadline = time.monotonic() + args.timeout
        done = 0
        while time.monotonic() < deadline:
            items = custom.list_namespaced_custom_object("disttrain.dev", "v1alpha1", ns, "disttrainjobs")["items"]
            done = sum((i.get("status") or {}).get("phase") == "Succeeded" for i in items)
            if done == args.jobs:
                break
            time.sleep(2.0)
        succeeded_s = time.monotonic() - t0
        cpu_s = cpu_seconds(op.pid) - cpu0
        time.sleep(2.0)  # the last writes' watch events
        status_watch.stop()
        from disttrain_api.progress import PROGRESS_INTERVAL_S

        # The operator runs with its default progress interval (its writes: max(poll, progress)).
        writes_seen = summarize(status_watch.jobs, interval_s=max(args.poll_interval, PROGRESS_INTERVAL_S),
                                end=time.monotonic())  # fmt: skip
        api_total = apiserver_requests() - api0
        text = op_metrics()
        op_requests = scrape_sum(text, "disttrain_operator_api_requests_total")
        by_call = scrape_by_label(text, "disttrain_operator_api_requests_total", ("verb", "resource"))
        reconciles = scrape_sum(text, "disttrain_operator_reconcile_seconds_count")
        reconcile_total_s = scrape_sum(text, "disttrain_operator_reconcile_seconds_sum")
        latencies = [all_created[n] - created_at[n] for n in names if n in all_created]
        writes = scrape_by_label(text, "disttrain_operator_status_writes_total", ("kind",))
        events_by_reason: dict[str, int] = {}
        for ev in core.list_namespaced_event(ns).items:
            if ev.involved_object.kind == "DistTrainJob":
                events_by_reason[ev.reason] = events_by_reason.get(ev.reason, 0) + (ev.count or 1)
        result = {
            "jobs": args.jobs,
            "workers": args.workers,
            "pods": args.jobs * args.workers,
            "jobs_with_all_pods": len(latencies),
            "apply_s": round(apply_s, 2),
            "all_pods_created_s": round(created_s, 2),
            "create_latency_p50_s": round(percentile(latencies, 0.5), 3) if latencies else None,
            "create_latency_p95_s": round(percentile(latencies, 0.95), 3) if latencies else None,
            "jobs_succeeded": done,
            "all_succeeded_s": round(succeeded_s, 1),
            "operator_cpu_s": round(cpu_s, 1),
            "operator_peak_rss_mb": round(peak_rss_mb(op.pid), 1),
            "operator_requests_per_job": round(op_requests / args.jobs, 1),
            # The same less the progress-only status writes (one per job per 10 s while it runs):
            # what a job costs besides reporting how far it got, comparable with --run-seconds 0.
            "operator_requests_per_job_less_progress": round((op_requests - writes.get("progress", 0.0)) / args.jobs, 1),
            "reconciles_per_job": round(reconciles / args.jobs, 1),
            "reconcile_mean_s": round(reconcile_total_s / max(reconciles, 1), 3),
            "operator_requests_per_job_by_call": {k: round(v / args.jobs, 2) for k, v in sorted(by_call.items()) if v},
            "status_writes_per_job_by_kind": {k: round(v / args.jobs, 2) for k, v in sorted(writes.items())},
            "events_per_job_by_reason": {k: round(v / args.jobs, 2) for k, v in sorted(events_by_reason.items())},
            "apiserver_requests_per_job": round(api_total / args.jobs, 1),
            "run_seconds": args.run_seconds,
            **writes_seen,
            "poll_interval_s": args.poll_interval,
            "operator_cgroup": str(op_cgroup) if op_cgroup else "host process",
            "apply_threads": args.apply_threads,
            "reference_all_created_s": reference.get("all_created_s"),
            "reference_job_p95_s": reference.get("job_p95_s"),
            "ratio_to_reference": round(created_s / reference["all_created_s"], 2) if reference else None,
        }
        print(json.dumps(result, indent=2))
        print(
            "\n| jobs x workers | all pods created | plain client | ratio | create p50 | create p95 | plain p95 | all Succeeded | "
            "operator CPU | peak RSS | operator req/job | apiserver req/job | status writes/job | "
            "status writes/job/min running | progress writes/job/min (max; cap) | min gap |\n"
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n"
            f"| {args.jobs} x {args.workers} | {result['all_pods_created_s']} s | {result['reference_all_created_s']} s | "
            f"{result['ratio_to_reference']} | {result['create_latency_p50_s']} s | "
            f"{result['create_latency_p95_s']} s | {result['reference_job_p95_s']} s | "
            f"{result['all_succeeded_s']} s ({done}/{args.jobs}) | "
            f"{result['operator_cpu_s']} s | {result['operator_peak_rss_mb']} MB | "
            f"{result['operator_requests_per_job']} | {result['apiserver_requests_per_job']} | "
            f"{result['status_writes_per_job']} | {result['status_writes_per_job_per_min_running']} | "
            f"{result['progress_writes_per_job_per_min_running']} ({result['progress_writes_per_job_per_min_max']}; "
            f"{result['progress_cap_per_min']:g}) | {result['progress_write_min_gap_s']} s |"
        )
        progress_seen = args.run_seconds <= 0 or bool(result["progress_writes_per_job_per_min_running"])
        if not progress_seen:
            print("no progress writes seen: the operator could not read worker 0's page (pod IPs not routed to "
                  "this host?) or no job ran for an interval", file=sys.stderr)  # fmt: skip
        if not result["progress_cap_held"]:
            print("progress writes above the cap of one per job per "
                  f"{60 / result['progress_cap_per_min']:g} s", file=sys.stderr)  # fmt: skip
        if args.json:
            args.json.write_text(json.dumps(result, indent=2))
        ok = done == args.jobs and len(latencies) == args.jobs and progress_seen and result["progress_cap_held"]
        return 0 if ok else 1
    finally:
        # Delete while the operator runs: kopf's finalizers must be released.
        subprocess.run(["kubectl", "delete", "namespace", ns, "--wait=true", "--timeout=300s"], env=env,
                       capture_output=True)
        op.terminate()
        try:
            op.wait(timeout=20)
        except subprocess.TimeoutExpired:
            op.kill()
            op.wait()
        log.close()
        if op_cgroup is not None:
            op_cgroup.rmdir()  # empty once the operator is gone


if __name__ == "__main__":
    sys.exit(main())
