"""`disttrain operator` flags and the kopf handler registration (no cluster)."""

from __future__ import annotations

import subprocess
import sys

import kopf
from disttrain_api import constants as c
from disttrain_api.model import GROUP, PLURAL
from disttrain_cli import build_parser


def test_operator_flags_parse() -> None:
    args = build_parser().parse_args(
        ["operator", "--namespace", "a", "-n", "b", "--metrics-port", "0", "--liveness", "http://0.0.0.0:8081/healthz",
         "--default-image", "img:2", "--poll-interval", "1.5"]
    )
    assert args.namespaces == ["a", "b"] and args.metrics_port == 0 and args.default_image == "img:2"
    assert args.poll_interval_s == 1.5 and args.liveness.endswith("/healthz")


def test_node_lost_timeout_defaults_to_kubernetes_eviction_and_is_configurable() -> None:
    from disttrain_operator import settings

    assert settings.from_env({}).node_lost_after_s == 300.0  # Kubernetes' pod-eviction default
    assert settings.from_env({"DISTTRAIN_OPERATOR_NODE_LOST_AFTER": "20"}).node_lost_after_s == 20.0
    args = build_parser().parse_args(["operator", "--node-lost-after", "15"])
    assert args.node_lost_after_s == 15.0
    assert build_parser().parse_args(["operator"]).node_lost_after_s is None  # unset: the env var or the default


def test_namespace_and_all_namespaces_are_exclusive() -> None:
    proc = subprocess.run([sys.executable, "-m", "disttrain_cli", "operator", "-n", "a", "--all-namespaces"],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "not allowed with argument" in proc.stderr


def test_handlers_watch_jobs_and_their_pods_but_put_no_finalizer_on_jobs() -> None:
    from disttrain_operator import handlers  # noqa: F401 - registers with kopf's default registry

    registry = kopf.get_default_registry()
    # Change handlers would make kopf write its bookkeeping annotations on every job (and
    # bump its resourceVersion under the status writes); every reconcile comes from events.
    assert not [h for h in registry._changing.get_all_handlers() if h.selector and h.selector.any_name == PLURAL]
    watching = registry._watching.get_all_handlers()
    jobs = [h for h in watching if h.selector and h.selector.any_name == PLURAL]
    pods = [h for h in watching if h.selector and h.selector.any_name == "pods"]
    assert len(jobs) == 1 and jobs[0].selector.group == GROUP
    assert len(pods) == 1 and pods[0].labels == {c.LABEL_JOB: kopf.PRESENT}  # only pods of jobs
    # The pod index: kopf calls no handler before its initial listing filled it, so a
    # restarted operator never takes a running gang for a missing one.
    indexing = [h for h in registry._indexing.get_all_handlers() if h.selector and h.selector.any_name == "pods"]
    assert [h.id for h in indexing] == ["pods_by_job"] and indexing[0].labels == {c.LABEL_JOB: kopf.PRESENT}
    # No timers/daemons and no mandatory delete handler: kopf would otherwise put its
    # finalizer on every job, and deleting a job with no operator running would hang.
    spawning = [h for h in registry._spawning.get_all_handlers() if h.selector and h.selector.any_name == PLURAL]
    assert spawning == []
