"""`disttrain explain RUN_DIR... | JOB`: forecast step time and scaling efficiency at other sizes and layouts.

The forecast itself is `disttrain_api.scaling` (pure arithmetic over the run's summary); this
command finds the inputs, prints the table and writes the PNG:

- RUN_DIR: a finished run's summary.json (`disttrain local` writes it). Several run dirs of
  the same model may be given: the one with the largest world size is forecast from, and a
  single-rank run among them gives the unsplit compute (the share tensor parallelism does
  not split). A run of one rank measures no link: give --bandwidth.
- JOB (any argument that is not a directory): the DistTrainJob's status.result in namespace
  -n, which the operator fills from rank 0's summary when the job succeeds. A running job
  has no result yet; its rank 0's metrics (when this machine can reach the pod) only show
  where the time goes now, which is printed instead.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from disttrain_api import constants as C
from disttrain_api import metric_names as mn
from disttrain_api.exitcodes import CONFIG as EXIT_INVALID
from disttrain_api.scaling import (
    InputError,
    Link,
    Measured,
    best_at,
    forecast,
    measured_from_summary,
)
from disttrain_operator.observe import parse_prometheus
from disttrain_operator.progress import read_bounded

from . import explain_report

EXIT_UNAVAILABLE = 1
SUMMARY_FILE = C.SUMMARY_FILENAME  # the trainer's rank 0 writes it into the run dir
METRICS_FILE = C.RANK_METRICS_FILENAME.format(rank=0)


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = subparsers.add_parser(
        "explain",
        help="forecast step time and scaling efficiency for 1-1024 workers from a run's measurements",
        description=(
            "From a finished run's measured step (compute, exposed and busy communication, data), the bytes "
            "each collective moved and the link its ranks measured, forecast step time, samples/s and "
            "efficiency (weak scaling) for N = 1 ... 1024 workers in every layout the model supports: data "
            "parallel (plain, fp16, PowerSGD), FSDP, pipeline, tensor and their products; name the fastest at "
            "--target; write a PNG of efficiency vs N."
        ),
    )
    p.add_argument("sources", nargs="+", metavar="RUN_DIR|JOB",
                   help="run dir(s) of one model (the largest world size is forecast from; a single-rank run "
                        "adds the unsplit compute), or the name of a DistTrainJob on the cluster")  # fmt: skip
    p.add_argument("-n", "--namespace", default="default", help="the job's namespace (JOB only)")
    p.add_argument("--target", type=int, default=None, metavar="N", help="name the fastest layout at N workers "
                   "(default: the largest N forecast)")  # fmt: skip
    p.add_argument("--max-n", type=int, default=1024, metavar="N", help="forecast N = 1, 2, 4, ... up to N (default 1024)")
    p.add_argument("--bandwidth", type=float, default=None, metavar="GB/s",
                   help="link bandwidth between hosts (default: the all-reduce probe of the run's ranks)")  # fmt: skip
    p.add_argument("--latency", type=float, default=None, metavar="us",
                   help="link latency per message with --bandwidth (default: the probe's, else 5 us)")  # fmt: skip
    p.add_argument("--ranks-per-host", type=int, default=None, metavar="K",
                   help="ranks sharing a host (default: as in the run; a local run keeps every rank on this host)")
    p.add_argument("--own-cores", action="store_true",
                   help="CPU ranks get cores of their own (default: as placed in the run, sharing the host's cores)")
    p.add_argument("--probe-host", action="store_true",
                   help="a run whose ranks shared this host's cores: measure this host's all-reduce with N local "
                        "gloo processes for each N up to 4 x its cores (seconds each; needs the trainer extra)")  # fmt: skip
    p.add_argument("--png", type=Path, default=None, help="where to write the plot (default: RUN_DIR/scaling-forecast.png)")
    p.set_defaults(handler=run)


def load_run_dir(path: Path) -> dict[str, Any]:
    """The trainer summary of a run dir; InputError says what is missing."""
    summary = path / SUMMARY_FILE
    if not summary.is_file():
        if (path / METRICS_FILE).is_file():
            raise InputError(f"{path}: no {SUMMARY_FILE}: the run has not finished (or failed before rank 0 wrote "
                             "it); explain needs a finished run")  # fmt: skip
        raise InputError(f"{path}: no metrics ({SUMMARY_FILE}, {METRICS_FILE}): not a disttrain run dir")
    try:
        data = json.loads(summary.read_text())
    except (OSError, ValueError) as exc:
        raise InputError(f"{summary}: cannot read it as JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise InputError(f"{summary}: not a JSON object")
    return data


def pick(runs: list[Measured]) -> tuple[Measured, Measured | None]:
    """(the run to forecast from: the largest world, a single-rank run of the same model or None)."""
    models = {r.parameters for r in runs}
    if len(models) > 1:
        raise InputError("the runs have different models (" + ", ".join(f"{r.source}: {r.parameters} parameters"
                                                                         for r in runs) + "); give runs of one model")  # fmt: skip
    primary = max(runs, key=lambda r: r.world_size)
    single = next((r for r in runs if r.world_size == 1 and r is not primary), None)
    return primary, single


def user_link(args: argparse.Namespace, m: Measured) -> Link | None:
    if args.bandwidth is None:
        if args.latency is not None:
            raise InputError("--latency needs --bandwidth")
        return None
    if args.bandwidth <= 0:
        raise InputError(f"--bandwidth {args.bandwidth}: give a bandwidth > 0 in GB/s")
    latency = args.latency * 1e-6 if args.latency is not None else (m.link.alpha_s if m.link else 5e-6)
    return Link(alpha_s=latency, beta_bytes_per_s=args.bandwidth * 1e9, source="given")


def probe_host_links(m: Measured, sizes: list[int]) -> dict[int, Link]:
    """This host's link at each forecast size from 3 ranks to 4 x its cores (a run on one CPU host only)."""
    if m.host.device != "cpu" or m.host.ranks_on_host < m.world_size:
        raise InputError("--probe-host: the run's ranks did not share this host's CPU cores (a local CPU run); "
                         "give the link of a cluster with --bandwidth/--latency")  # fmt: skip
    try:
        from disttrain_trainer.launcher.link_probe import probe_host  # noqa: PLC0415 - torch
    except ImportError as exc:
        raise InputError(f"--probe-host needs the trainer extra (torch): pip install 'disttrain[trainer]' ({exc})") from exc
    links = {}
    for n in sizes:
        if 2 < n <= 4 * m.host.cores:
            print(f"probing this host's all-reduce with {n} local ranks ...", file=sys.stderr, flush=True)
            got = probe_host(n)
            links[n] = Link(alpha_s=got["alphaS"], beta_bytes_per_s=got["betaBytesPerS"], source="host", contended=True)
    return links


def explain(runs: list[Measured], args: argparse.Namespace, png: Path) -> str:
    """The forecast as text, the PNG written to `png`."""
    primary, single = pick(runs)
    sizes = [2**k for k in range(11) if 2**k <= args.max_n]
    all_sizes = sorted({*sizes, args.target or sizes[-1]})
    host_links = probe_host_links(primary, all_sizes) if args.probe_host else None
    fc = forecast(primary, single=single, link=user_link(args, primary), ranks_per_host=args.ranks_per_host,
                  own_cores=args.own_cores, sizes=all_sizes, host_links=host_links)  # fmt: skip
    # Default: the largest N forecast (sizes whose ranks would oversubscribe a CPU host are not).
    target = args.target or max(n for n in fc.sizes if n not in fc.refused)
    choice = best_at(fc, target)
    text = explain_report.format_table(fc, choice)
    written = explain_report.write_plot(fc, png, target=target)
    tail = f"plot: {written}" if written else "plot: skipped (matplotlib is not installed: pip install 'disttrain[trainer]')"
    return text + "\n" + tail


def _job(args: argparse.Namespace) -> tuple[list[Measured], Path] | int:
    """The job's status.result as a run, or an exit code after saying why there is none."""
    name = args.sources[0]
    if len(args.sources) > 1:
        print(f"disttrain explain: {name} is not a run dir, and a JOB comes alone", file=sys.stderr)
        return EXIT_INVALID
    try:
        from disttrain_operator import kube  # noqa: PLC0415 - kubernetes
    except ImportError:
        print("disttrain explain JOB needs the kubernetes client: pip install 'disttrain[operator]'", file=sys.stderr)
        return EXIT_UNAVAILABLE
    try:
        kube.load_config()
        job = kube.Kube().get_job(args.namespace, name)
    except Exception as exc:  # noqa: BLE001 - config, network and API errors all end here with the reason
        print(f"disttrain explain: cannot read DistTrainJob {args.namespace}/{name}: {exc}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    if job is None:
        print(f"disttrain explain: no directory {name!r} and no DistTrainJob {args.namespace}/{name}", file=sys.stderr)
        return EXIT_INVALID
    status = job.get("status") or {}
    result = status.get("result")
    if not isinstance(result, dict):
        print(f"disttrain explain: {args.namespace}/{name} is {status.get('phase', 'Pending')} and has no "
              "status.result yet: the forecast's inputs (step breakdown, bytes per collective, the link probe) "
              "arrive with rank 0's summary when the job succeeds", file=sys.stderr)  # fmt: skip
        _print_live(kube, job, args.namespace, name)
        return EXIT_UNAVAILABLE
    return [measured_from_summary(result, source=f"{args.namespace}/{name}")], args.png or Path(f"{name}-{explain_report.PLOT_FILE}")


def _print_live(kube: Any, job: dict[str, Any], namespace: str, name: str) -> None:
    """What rank 0's metrics say now, when this machine reaches the pod; the rest is missing."""
    port = ((job.get("spec") or {}).get("metrics") or {}).get("port")
    pod = kube.Kube().get({"apiVersion": "v1", "kind": "Pod", "metadata": {"namespace": namespace, "name": f"{name}-worker-0"}})
    ip = ((pod or {}).get("status") or {}).get("podIP")
    if not ip or not port:
        print("rank 0's metrics: no pod IP or metrics port yet", file=sys.stderr)
        return
    series = (mn.STEP, mn.STEP_COMPUTE_SECONDS, mn.STEP_COMM_EXPOSED_SECONDS, mn.STEP_COMM_BUSY_SECONDS, mn.STEP_DATA_SECONDS)
    body = read_bounded(ip, int(port), timeout_s=2.0)  # the operator's bounded scrape: the pod runs user code
    if body is None:
        print(f"rank 0's metrics at {ip}:{port}: no answer from here", file=sys.stderr)
        return
    found = parse_prometheus(body.decode("utf-8", "replace"), series)
    print("rank 0 now (per step, last log interval): " + ", ".join(f"{k.removeprefix(mn.PREFIX)} {v:.4g}"
                                                                  for k, v in found.items()), file=sys.stderr)  # fmt: skip


def run(args: argparse.Namespace) -> int:
    paths = [Path(s) for s in args.sources]
    try:
        if all(p.is_dir() for p in paths):
            runs = [measured_from_summary(load_run_dir(p), source=str(p)) for p in paths]
            png = args.png or paths[0] / explain_report.PLOT_FILE
        elif any(p.is_dir() for p in paths):
            missing = [str(p) for p in paths if not p.is_dir()]
            raise InputError(f"not a directory: {', '.join(missing)} (give run dirs, or one JOB name)")
        else:
            got = _job(args)
            if isinstance(got, int):
                return got
            runs, png = got
        if args.target is not None and not 1 <= args.target <= 1_000_000:
            raise InputError(f"--target {args.target}: give a number of workers >= 1")
        print(explain(runs, args, png))
    except InputError as exc:
        print(f"disttrain explain: {exc}", file=sys.stderr)
        return EXIT_INVALID
    return 0
