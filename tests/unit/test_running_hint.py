"""A running job's scaling hint: the pure decision (disttrain_api/scaling/hint.py) against
hand-computed cases, the reading the operator's scrape makes of rank 0 (a real HTTP server), and
the decision wired into the reconciler's status and Events."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
from disttrain_api import metric_names as names
from disttrain_api import model as api
from disttrain_api.scaling.hint import (
    EXPOSED_HINT_FRACTION,
    HINT_CLEAR_FRACTION,
    Proposal,
    hint_text,
    propose,
    running_hint,
)
from disttrain_operator import progress as scraper
from disttrain_operator.decide import decide
from disttrain_operator.decision import Observed
from disttrain_operator.observe import PodView
from disttrain_trainer.telemetry.step_metrics import Metrics
from ports import free_port  # tests/ports.py: each xdist worker's own slice

MS = 1e-3


def inputs(*, world: int = 8, exposed: float = 10.5 * MS, busy: float = 18.5 * MS, beta: float = 1e8,
           mode: str = "data") -> dict[str, Any]:  # fmt: skip
    """Forecast inputs shaped as rank 0 publishes them: a run that waits on a 100 MB/s link.

    By hand (as in test_scaling_model's communication-bound case): step 21.5 ms = data 1 +
    compute 10 + exposed 10.5; 1 MB of gradients; PowerSGD at rank 2 sends 2 x 10 kB + 1 kB =
    2.1 % of them, so its all-reduce takes 2 x 7/8 x 21 kB / 100 MB/s = 0.3675 ms plus the
    measured overhead: the step falls to 11 + 1.3675 / 12 ms, +93 % samples/s over dp8."""
    step = 1 * MS + 10 * MS + exposed
    return {
        "mode": mode, "worldSize": world, "layout": f"dp={world},pp=1,tp=1", "device": "cuda", "backend": "nccl",
        "dataStrategy": "ddp", "commExposedFraction": exposed / step,
        "scaling": {
            "perStep": {"stepS": step, "dataS": 1 * MS, "computeS": 10 * MS, "commExposedS": exposed,
                        "commBusyS": busy, "idleS": 0.0, "steps": 50},
            "batchPerReplica": 32, "parameters": 250_000, "parameterBytes": 1_000_000, "gradientBytes": 1_000_000,
            "blocks": 3, "buckets": 4, "compression": {"kind": "none"},
            "link": {"alphaS": 0.0, "betaBytesPerS": beta, "worldSize": world},
            "host": {"cores": 2, "ranksOnHost": world, "threadsPerRank": 1},
            "lowRank": {"bytesPerRank": 10_000, "uncompressedBytes": 1_000},
        },
    }  # fmt: skip


GAIN = 21.5 / (11 + 1.3675 / 12) - 1  # +93 %
BOUND = propose(inputs())
QUIET = inputs(exposed=0.2 * MS, busy=2 * MS, beta=1e10)


def test_the_forecast_names_powersgd_for_the_communication_bound_run() -> None:
    assert BOUND is not None and BOUND.change == "dp8 powersgd" and BOUND.current == "dp8"
    assert BOUND.gain == pytest.approx(GAIN) and BOUND.world_size == 8
    # One worker: data + compute = 11 ms for 32 samples; eight: 8 x 32 per 21.5 ms.
    assert BOUND.efficiency == pytest.approx(11 / 21.5)
    assert hint_text(0.38, BOUND) == f"exposed communication 38% of the step: dp8 powersgd forecast +{GAIN:.0%} samples/s over dp8"


def test_no_change_is_proposed_where_the_forecast_has_none_or_cannot_say() -> None:
    # 0.2 ms exposed of 2 ms busy on a 10 GB/s link: no compression is worth a hint.
    quiet = propose(QUIET)
    assert quiet is not None and quiet.change is None and quiet.gain == 0.0
    assert quiet.efficiency == pytest.approx(11 / 11.2)  # one worker 11 ms; the run 11.2 ms a step
    assert propose(inputs(mode="federated")) is None  # not modelled
    assert propose({**inputs(), "dataStrategy": "fsdp"}) is None  # no compression hook to change
    assert propose({**inputs(), "scaling": "cut short"}) is None
    assert propose(inputs(), world_size=4) is None  # the pod's claim is not the job's size
    assert propose(None) is None


def decide_hint(prev: str | None, exposed: float | None, proposal: Proposal | None = BOUND, *,
                known: bool = True, world_size: int = 8) -> str | None:  # fmt: skip
    return running_hint(prev, exposed=exposed, proposal=proposal, known=known, world_size=world_size)


def test_below_the_threshold_there_is_no_hint() -> None:
    assert decide_hint(None, EXPOSED_HINT_FRACTION - 0.01) is None
    assert decide_hint(None, 0.10) is None
    assert decide_hint(None, None) is None  # no reading yet
    assert decide_hint(None, 0.38) == hint_text(0.38, BOUND)
    assert decide_hint(None, EXPOSED_HINT_FRACTION) == hint_text(EXPOSED_HINT_FRACTION, BOUND)


def test_a_hint_needs_a_change_for_the_jobs_own_size() -> None:
    assert decide_hint(None, 0.38, None) is None  # the inputs do not fit the model
    assert decide_hint(None, 0.38, propose(QUIET)) is None  # nothing worth a hint
    assert decide_hint(None, 0.38, world_size=16) is None  # published by a pod claiming another size
    shown = hint_text(0.38, BOUND)
    assert decide_hint(shown, 0.38, None) is None  # the forecast no longer holds: withdrawn


def test_a_job_hovering_around_the_threshold_does_not_flap() -> None:
    """The exposed fraction of successive intervals, and the hints they give: one appearance, one
    text kept through the noise, one withdrawal once well below the threshold."""
    readings = [0.24, 0.26, 0.24, 0.22, 0.27, 0.38, 0.21, 0.25, 0.19, 0.24, 0.23, 0.26]
    hints, prev = [], None
    for exposed in readings:
        prev = decide_hint(prev, exposed)
        hints.append(prev)
    first = hint_text(0.26, BOUND)
    assert hints == [None, first, first, first, first, first, first, first, None, None, None,
                     hint_text(0.26, BOUND)]  # fmt: skip
    changes = sum(1 for a, b in zip([None, *hints], hints, strict=False) if a != b)
    assert changes == 3  # shown, withdrawn (at 0.19 < HINT_CLEAR_FRACTION), shown again
    assert HINT_CLEAR_FRACTION < 0.21 < EXPOSED_HINT_FRACTION


def test_an_unread_forecast_keeps_the_hint_as_it_is() -> None:
    shown = hint_text(0.30, BOUND)
    assert decide_hint(shown, 0.30, None, known=False) == shown  # a failed fetch says nothing
    assert decide_hint(None, 0.30, None, known=False) is None
    assert decide_hint(shown, 0.10, None, known=False) is None  # below: withdrawn without the inputs
    assert decide_hint(shown, None) == shown


def test_another_best_change_replaces_the_text() -> None:
    shown = hint_text(0.30, BOUND)
    fp16 = Proposal(world_size=8, efficiency=0.5, change="dp8 fp16", current="dp8", gain=0.12)
    assert decide_hint(shown, 0.31, fp16) == hint_text(0.31, fp16)
    bigger = Proposal(world_size=8, efficiency=0.4, change="dp8 powersgd", current="dp8", gain=1.5)
    assert decide_hint(shown, 0.45, bigger) == shown  # the same change: the same text, no new Event


# ------------------------------------------------------------------ the operator's reading



def test_the_scrape_reads_the_inputs_rank_0_publishes() -> None:
    port = free_port()
    m = Metrics(job="j", rank=0, mode="data", port=port, run_dir=None, namespace="ns")
    try:
        m.exposed_fraction.set(0.1)
        low = scraper.scrape("127.0.0.1", port)
        assert low is not None and low[names.COMM_EXPOSED_FRACTION] == 0.1 and scraper.FORECAST not in low
        m.exposed_fraction.set(0.4)
        unpublished = scraper.scrape("127.0.0.1", port)  # the first steady interval has not ended
        assert unpublished is not None and scraper.FORECAST not in unpublished
        m.observe_forecast(inputs())
        reading = scraper.scrape("127.0.0.1", port)
        assert reading is not None and reading[scraper.FORECAST] == BOUND
        # The same figures rank 0 exports for the dashboard.
        again = scraper.read_bounded("127.0.0.1", port, timeout_s=2.0)
        assert again is not None
        text = again.decode()
        assert f"{names.FORECAST_EFFICIENCY}{{" in text and f"{names.FORECAST_GAIN}{{" in text
        gain = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(names.FORECAST_GAIN + "{")]
        assert gain == [pytest.approx(GAIN, rel=1e-6)]
        served = scraper.read_bounded("127.0.0.1", port, timeout_s=2.0, path=names.FORECAST_INPUTS_PATH)
        assert served is not None and json.loads(served) == inputs()
        m.observe_forecast({**inputs(), "scaling": "garbage"})  # a user's pod may publish anything
        odd = scraper.scrape("127.0.0.1", port)
        assert odd is not None and scraper.FORECAST in odd and odd[scraper.FORECAST] is None
    finally:
        m.close()


# ------------------------------------------------------------------ the reconciler's decision

SPEC = api.parse_spec({"mode": "data", "workers": {"replicas": 8}})
NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def running(reading: dict[str, Any], hint: str | None = None, *,
            status: dict[str, Any] | None = None) -> tuple[dict[str, Any], list[tuple[str, str, str]]]:  # fmt: skip
    """The status and ScalingHint Events after one reading of a running 8-worker gang; `status`: the
    one the previous reconcile wrote (else a fresh running job's, with `hint`)."""
    if status is None:
        status = {
            "phase": "Running", "attempt": 0, "replicas": 8, "restarts": 0, "lastSpecReplicas": 8,
            "observedGeneration": 1, "startTime": "2026-01-01T11:59:00Z",
            "conditions": [{"type": "Running", "status": "True", "reason": "GangRunning"}],
        }  # fmt: skip
        if hint is not None:
            status["hint"] = hint
    pods = [PodView(name=f"j-worker-{i}", role="worker", index=i, attempt=0, phase="Running", scheduled=True)
            for i in range(8)]  # fmt: skip
    plan = decide(Observed(generation=1, spec=SPEC, accepted=SPEC, status=status, pods=pods, now=NOW,
                           progress={names.STEP: 100.0, **reading}, progress_time=NOW))  # fmt: skip
    return plan.status, [e for e in plan.events if e[1] == "ScalingHint"]


def test_a_running_job_gets_the_hint_once_and_loses_it_below_the_clear_threshold() -> None:
    status, events = running({names.COMM_EXPOSED_FRACTION: 0.38, scraper.FORECAST: BOUND})
    text = hint_text(0.38, BOUND)
    assert status["phase"] == "Running" and status["hint"] == text
    assert events == [("Normal", "ScalingHint", text)]
    # The next readings: the figures move, the hint and its Event do not.
    status, events = running({names.COMM_EXPOSED_FRACTION: 0.23, scraper.FORECAST: BOUND}, hint=text)
    assert status["hint"] == text and events == []
    status, events = running({names.COMM_EXPOSED_FRACTION: 0.41}, hint=text)  # inputs not read this time
    assert status["hint"] == text and events == []
    status, events = running({names.COMM_EXPOSED_FRACTION: 0.12}, hint=text)
    assert "hint" not in status and events == []
    status, events = running({names.COMM_EXPOSED_FRACTION: 0.12})
    assert "hint" not in status and events == []


def test_a_hint_that_comes_back_with_the_same_change_is_not_announced_again() -> None:
    """A loaded node's intervals swing across both thresholds: the hint goes and comes back, and
    only a change the last Event did not name is news. The reconciles carry their status along."""
    status, events = running({names.COMM_EXPOSED_FRACTION: 0.38, scraper.FORECAST: BOUND})
    assert len(events) == 1 and status["hintAnnounced"] == "dp8 powersgd"
    status, events = running({names.COMM_EXPOSED_FRACTION: 0.12}, status=status)
    assert "hint" not in status and events == [] and status["hintAnnounced"] == "dp8 powersgd"
    status, events = running({names.COMM_EXPOSED_FRACTION: 0.33, scraper.FORECAST: BOUND}, status=status)
    assert status["hint"] == hint_text(0.33, BOUND) and events == []  # back, the same change: no Event
    fp16 = Proposal(world_size=8, efficiency=0.5, change="dp8 fp16", current="dp8", gain=0.12)
    status, events = running({names.COMM_EXPOSED_FRACTION: 0.35, scraper.FORECAST: fp16}, status=status)
    assert events == [("Normal", "ScalingHint", hint_text(0.35, fp16))] and status["hintAnnounced"] == "dp8 fp16"
    status, events = running({names.COMM_EXPOSED_FRACTION: 0.12}, status=status)
    status, events = running({names.COMM_EXPOSED_FRACTION: 0.40, scraper.FORECAST: BOUND}, status=status)
    assert events == [("Normal", "ScalingHint", hint_text(0.40, BOUND))]  # not the last one announced: news


def test_a_finished_jobs_hint_is_announced_only_when_it_names_another_change() -> None:
    status, _ = running({names.COMM_EXPOSED_FRACTION: 0.38, scraper.FORECAST: BOUND})
    summary = {**inputs(), "testAccuracy": 0.9, "steps": 100}
    done_pods = [PodView(name=f"j-worker-{i}", role="worker", index=i, attempt=0, phase="Succeeded", scheduled=True,
                         message=json.dumps(summary) if i == 0 else "") for i in range(8)]  # fmt: skip
    plan = decide(Observed(generation=1, spec=SPEC, accepted=SPEC, status=status, pods=done_pods, now=NOW))
    assert plan.status["phase"] == "Succeeded"
    assert plan.status["hint"].endswith("dp8 powersgd forecast +93% samples/s over dp8")  # the whole run's figures
    assert [e for e in plan.events if e[1] == "ScalingHint"] == []  # the running hint named it already
    fresh = {k: v for k, v in status.items() if k not in ("hint", "hintAnnounced")}
    plan = decide(Observed(generation=1, spec=SPEC, accepted=SPEC, status=fresh, pods=done_pods, now=NOW))
    assert [e[2] for e in plan.events if e[1] == "ScalingHint"] == [plan.status["hint"]]
