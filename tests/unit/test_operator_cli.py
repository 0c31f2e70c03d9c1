"""`disttrain operator` flags and the kopf handler registration (no cluster)."""

from __future__ import annotations

import subprocess
import sys

import kopf
from disttrain_api.model import GROUP, PLURAL
from disttrain_operator.cli import build_parser


def test_operator_flags_parse() -> None:
    args = build_parser().parse_args(
        ["operator", "--namespace", "a", "-n", "b", "--metrics-port", "0", "--liveness", "http://0.0.0.0:8081/healthz",
         "--default-image", "img:2", "--poll-interval", "1.5"]
    )
    assert args.namespaces == ["a", "b"] and args.metrics_port == 0 and args.default_image == "img:2"
    assert args.poll_interval_s == 1.5 and args.liveness.endswith("/healthz")


def test_namespace_and_all_namespaces_are_exclusive() -> None:
    proc = subprocess.run([sys.executable, "-m", "disttrain_operator", "operator", "-n", "a", "--all-namespaces"],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "not allowed with argument" in proc.stderr


def test_handlers_register_create_resume_update_and_watch_events_but_no_finalizer() -> None:
    from disttrain_operator import handlers  # noqa: F401 - registers with kopf's default registry

    registry = kopf.get_default_registry()
    ours = [h for h in registry._changing.get_all_handlers() if h.selector and h.selector.any_name == PLURAL]
    assert {"create", "update"} <= {h.reason.value for h in ours if h.reason}
    assert any(h.initial for h in ours)  # on.resume: a restarted operator re-reconciles every job
    update = next(h for h in ours if h.reason and h.reason.value == "update")
    assert update.field == ("spec",)  # status/metadata writes do not re-trigger it
    watching = [h for h in registry._watching.get_all_handlers() if h.selector and h.selector.any_name == PLURAL]
    assert len(watching) == 1  # on.event keeps the registry of jobs for the periodic reconcile
    assert all(h.selector.group == GROUP for h in ours + watching)
    # No timers/daemons and no mandatory delete handler: kopf would otherwise put its
    # finalizer on every job, and deleting a job with no operator running would hang.
    spawning = [h for h in registry._spawning.get_all_handlers() if h.selector and h.selector.any_name == PLURAL]
    assert spawning == []
    assert not any(h.requires_finalizer for h in ours)
