"""The forecast's step-time model against hand-computed cases, through the summary a trainer writes."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
from disttrain_api import model as api
from disttrain_api.scaling import (
    InputError,
    Layout,
    Link,
    best_alternative,
    best_at,
    forecast,
    measured_from_summary,
)
from disttrain_api.scaling.hint import scaling_hint
from disttrain_api.scaling.model import step_time
from disttrain_api.scaling.pipeline_time import time_shared_makespan
from disttrain_operator.decide import decide
from disttrain_operator.decision import Observed
from disttrain_operator.observe import PodView

MS = 1e-3
FAST = {"alphaS": 0.0, "betaBytesPerS": 1e9, "worldSize": 2}  # 1 GB/s, no latency: bytes / 1e6 = ms


def summary(*, world: int = 2, layout: str | None = None, mode: str = "data", device: str = "cuda",
            backend: str = "nccl", step: float, compute: float, data: float = 0.0, exposed: float = 0.0,
            busy: float = 0.0, grad: int = 1_000_000, buckets: int = 4, compression: dict[str, Any] | None = None,
            link: dict[str, Any] | None = FAST, cores: float = 2, ranks_on_host: int | None = None,
            batch: int = 32, blocks: int = 3, **scaling: Any) -> dict[str, Any]:  # fmt: skip
    """A trainer summary (summary.json / status.result) with the given per-step figures."""
    return {
        "mode": mode, "worldSize": world, "layout": layout or f"dp={world},pp=1,tp=1", "device": device,
        "backend": backend, "dataStrategy": "ddp",
        "scaling": {
            "perStep": {"stepS": step, "dataS": data, "computeS": compute, "commExposedS": exposed,
                        "commBusyS": busy, "idleS": 0.0, "steps": 50},
            "batchPerReplica": batch, "parameters": grad // 4, "parameterBytes": grad, "gradientBytes": grad,
            "blocks": blocks, "buckets": buckets, "compression": compression or {"kind": "none"},
            "link": link, "host": {"cores": cores, "ranksOnHost": ranks_on_host or world, "threadsPerRank": 1},
            **scaling,
        },
    }  # fmt: skip


def predict(s: dict[str, Any], lay: Layout, *, single: dict[str, Any] | None = None, **kw: Any) -> float:
    fc = forecast(measured_from_summary(s, source="run"), single=single and measured_from_summary(single, source="one"),
                  sizes=(1, lay.n), **kw)  # fmt: skip
    return step_time(fc.calibrated, lay, fc.topology, fc.placement).step_s


DP_RUN = summary(step=12 * MS, data=1 * MS, compute=10 * MS, busy=3 * MS, exposed=1 * MS)


def test_data_parallel_by_hand() -> None:
    # window W = busy - exposed = 2 ms; all-reduce at 2 ranks = 1 MB / 1 GB/s = 1 ms; the
    # communication min(busy 3, exposed 1 x 4 calls) = 3 ms leaves R = 2 ms the link does not explain.
    # N = 8: busy = 2 + 2 x 7/8 x 1 = 3.75 ms, exposed = max(3.75 - 2, 3.75 / 4) = 1.75 ms
    assert predict(DP_RUN, Layout(dp=8)) == pytest.approx(12.75 * MS)
    assert predict(DP_RUN, Layout(dp=2)) == pytest.approx(12 * MS)  # the run itself
    fc = forecast(measured_from_summary(DP_RUN, source="run"), sizes=(1, 8))
    p = fc.points[(8, "data")]
    assert p.efficiency == pytest.approx(11 / 12.75)  # one worker: data + compute = 11 ms
    assert p.samples_per_s == pytest.approx(8 * 32 / (12.75 * MS))


def test_cpu_ranks_sharing_cores_slow_everything() -> None:
    run = summary(step=12 * MS, data=1 * MS, compute=10 * MS, busy=3 * MS, exposed=1 * MS, device="cpu", backend="gloo")
    # N = 4 on the run's 2 cores: x2; busy = 2 + 1.5 = 3.5 ms, exposed = max(1.5, 0.875): (1 + 10 + 1.5) x 2
    assert predict(run, Layout(dp=4)) == pytest.approx(25 * MS)
    assert predict(run, Layout(dp=4), own_cores=True) == pytest.approx(12.5 * MS)


def test_a_link_measured_with_the_targets_contention_is_not_stretched_again() -> None:
    run = summary(step=12 * MS, data=1 * MS, compute=10 * MS, busy=3 * MS, exposed=1 * MS, device="cpu", backend="gloo")
    host = Link(alpha_s=0.0, beta_bytes_per_s=0.25e9, source="host", contended=True)
    # N = 4, c = 2: R and the window stretch (4 ms each), the ring does not: 2 x 3/4 x 1 MB / 0.25 GB/s = 6 ms;
    # exposed = max(4 + 6 - 4, 10 / 4) = 6 ms; step = 2 x (1 + 10) + 6
    assert predict(run, Layout(dp=4), host_links={4: host}) == pytest.approx(28 * MS)
    assert predict(run, Layout(dp=4)) == pytest.approx(25 * MS)  # without it: the run's link x 2


def test_powersgd_hook_that_holds_up_backward() -> None:
    # gloo: the hook's 3 ms sat inside compute; compute alone 10 - (3 - 0.01) ms; it sent 1e5 bytes
    # (10 %) in 3 all-reduces: R = 3 - 0.1 ms. N = 4: busy = 2.9 + 2 x 3/4 x 0.1 = 3.05 ms, all exposed
    run = summary(step=10.01 * MS, compute=10 * MS, busy=3 * MS, exposed=0.01 * MS, device="cpu", backend="gloo",
                  buckets=1, compression={"kind": "powersgd", "rank": 2, "wireBytes": 100_000, "calls": 3,
                                          "blocksBackward": True})  # fmt: skip
    assert predict(run, Layout(dp=4, compression="powersgd"), own_cores=True) == pytest.approx(10.06 * MS)


POWERSGD = {"kind": "powersgd", "rank": 2, "wireBytes": 100_000, "calls": 3, "blocksBackward": True}


def test_a_single_rank_run_splits_the_hooks_own_work_from_the_wait_for_peers() -> None:
    # The run above (3 ms busy, link model 0.1 ms) and one rank of the same hook: 1 ms busy with no
    # peer = R. The other 1.9 ms waited for the peer over 2 x (2 - 1) x 3 = 6 ring steps: H = 1.9 / 6 ms.
    # N = 4, own cores: busy = 1 + 2 x 3 x 3 x H + 0.15 = 6.85 ms, all exposed; compute 10 - 2.99 ms
    run = summary(step=10.01 * MS, compute=10 * MS, busy=3 * MS, exposed=0.01 * MS, device="cpu", backend="gloo",
                  buckets=1, compression=POWERSGD)  # fmt: skip
    one = summary(world=1, step=5 * MS, compute=5 * MS, busy=1 * MS, device="cpu", backend="gloo", buckets=1,
                  compression=POWERSGD, link=None)  # fmt: skip
    lay = Layout(dp=4, compression="powersgd")
    assert predict(run, lay, single=one, own_cores=True) == pytest.approx(13.86 * MS)
    assert predict(run, lay, own_cores=True) == pytest.approx(10.06 * MS)  # no single run: all 2.9 ms are R
    # The single run of another compression says nothing of this hook's own work: as without it.
    plain_one = summary(world=1, step=5 * MS, compute=5 * MS, busy=1 * MS, device="cpu", backend="gloo", link=None)
    assert predict(run, lay, single=plain_one, own_cores=True) == pytest.approx(10.06 * MS)
    # On the run's 2 cores (c = 2) with the ring probed under that contention (not stretched again):
    # a ring step takes the longer of the probe's latency and c x (the run's 0 + H) = 0.633 ms.
    # 1 ms probed: the probe's; busy = 2 x 1 + 18 x 1 + 0.15 = 20.15 ms; step = 2 x 7.01 + 20.15
    host = {4: Link(alpha_s=1 * MS, beta_bytes_per_s=1e9, source="host", contended=True)}
    assert predict(run, lay, single=one, host_links=host) == pytest.approx(34.17 * MS)
    # 0.5 ms probed: each of the 18 steps waits 0.133 ms more: busy = 2 + 2.4 + 9.15 ms
    host = {4: Link(alpha_s=0.5 * MS, beta_bytes_per_s=1e9, source="host", contended=True)}
    assert predict(run, lay, single=one, host_links=host) == pytest.approx(27.57 * MS)


def test_a_probe_slower_than_the_runs_own_ring_steps_gives_way_to_them() -> None:
    # The run's probe says 1 ms a message, but its 6 ring steps (2 x (2 - 1) x 3 calls) and R = 1 ms
    # took 3 ms in all: the link model (6 + 0.1 ms) overshoots the run by 4.1 ms, H = -4.1 / 6 ms.
    # A step keeps 1 - 4.1/6 = 0.317 ms (of latency, at most the probe's). N = 4, own cores:
    # busy = 1 + 18 x 0.317 + 0.15 = 6.85 ms, as a probe of no latency would give.
    slow_probe = {"alphaS": 1 * MS, "betaBytesPerS": 1e9, "worldSize": 2}
    run = summary(step=10.01 * MS, compute=10 * MS, busy=3 * MS, exposed=0.01 * MS, device="cpu", backend="gloo",
                  buckets=1, compression=POWERSGD, link=slow_probe)  # fmt: skip
    one = summary(world=1, step=5 * MS, compute=5 * MS, busy=1 * MS, device="cpu", backend="gloo", buckets=1,
                  compression=POWERSGD, link=None)  # fmt: skip
    lay = Layout(dp=4, compression="powersgd")
    assert predict(run, lay, single=one, own_cores=True) == pytest.approx(13.86 * MS)
    # Steps that took no time at all: H stops at minus the latency (no step is faster than free).
    quick = summary(step=10.01 * MS, compute=10 * MS, busy=1.05 * MS, exposed=0.01 * MS, device="cpu", backend="gloo",
                    buckets=1, compression=POWERSGD, link=slow_probe)  # fmt: skip
    # R = 1 ms, the bytes at N = 4 2 x 3/4 x 0.1 = 0.15 ms, no latency: busy = 1.15 ms; compute 10 - 1.04 ms
    assert predict(quick, lay, single=one, own_cores=True) == pytest.approx((8.96 + 1.15) * MS)


def test_fsdp_from_a_data_parallel_run() -> None:
    # 1 GB of parameters, 5 blocks -> 4 FSDP units, 10 GB/s; N = 8: all-gather 7/8 x 100 ms, twice,
    # reduce-scatter 87.5 ms: 262.5 ms, hidden under 100 ms of compute but for the rest: 162.5 ms
    run = summary(step=100.5 * MS, compute=100 * MS, busy=1 * MS, exposed=0.5 * MS, grad=1_000_000_000, blocks=5,
                  link={"alphaS": 0.0, "betaBytesPerS": 1e10, "worldSize": 2})  # fmt: skip
    assert predict(run, Layout(dp=8, strategy="fsdp")) == pytest.approx(262.5 * MS)
    gloo = {**run, "backend": "gloo"}  # no reduce-scatter: an all-reduce of the whole buffer, 175 ms
    assert predict(gloo, Layout(dp=8, strategy="fsdp")) == pytest.approx(350 * MS)


TP_RUN = summary(layout="dp=1,pp=1,tp=2", mode="tensor", step=9 * MS, compute=8 * MS, exposed=1 * MS, busy=1 * MS,
                 tensorComm={"count": 10, "bytes": 1_000_000, "source": "measured"}, tensorLimit=4)  # fmt: skip
ONE_RANK = summary(world=1, step=10 * MS, compute=10 * MS, link=None)


def test_tensor_parallel_by_hand() -> None:
    # the collectives at tp 2: 1 MB / 1 GB/s = 1 ms, so compute at tp 2 = 9 - 1 = 8 ms. With the
    # single-rank run's 10 ms: 5 ms split, 3 ms added by tensor parallelism. tp 4: 2.5 + 3 + 1.5 ms
    assert predict(TP_RUN, Layout(tp=4), single=ONE_RANK) == pytest.approx(7 * MS)
    # without it the compute splits perfectly: C = 16 ms, tp 4: 4 + 1.5 ms
    assert predict(TP_RUN, Layout(tp=4)) == pytest.approx(5.5 * MS)
    # the single-rank run is N = 1 and the base of every efficiency: 10 ms against 4 x 7 ms at tp 4
    fc = forecast(measured_from_summary(TP_RUN, source="tp2"), single=measured_from_summary(ONE_RANK, source="one"),
                  sizes=(1, 4))  # fmt: skip
    assert fc.points[(1, "tensor")].step_s == pytest.approx(10 * MS)
    assert fc.points[(4, "tensor")].efficiency == pytest.approx(10 / (4 * 7))


PIPE_RUN = summary(layout="dp=1,pp=2,tp=1", mode="pipeline", step=12 * MS, compute=8 * MS, blocks=4,
                   pipeline={"blockSeconds": [1 * MS] * 4, "blockOutBytes": [0] * 4,
                             "stageComputeS": [8 * MS, 8 * MS], "boundaryBytes": [0]})  # fmt: skip
PIPE_RUN["pipeline"] = {"schedule": "1F1B", "stages": 2, "microbatches": 4}


def test_pipeline_by_hand() -> None:
    # 4 blocks of 1 ms (the measured 16 ms / 4 micro-batches), 2 stages: makespan 2 + 2 + 3 x 2 = 10 ms;
    # the run took 12: 0.4 ms per slot (m + p - 1 = 5). 4 stages of 1.4 ms: 4 x 1.4 + 3 x 1.4 = 9.8 ms
    assert predict(PIPE_RUN, Layout(pp=4)) == pytest.approx(9.8 * MS)
    assert predict(PIPE_RUN, Layout(pp=2)) == pytest.approx(12 * MS)


def test_pipeline_on_shared_cores_is_its_schedule_under_fair_sharing() -> None:
    run = {**PIPE_RUN, "device": "cpu", "backend": "gloo"}
    # 4 stage processes on 2 cores (c = 2): each stage 1.4 ms per micro-batch (a third forward),
    # 4 micro-batches, no message time, sharing 2 cores (pipeline_time.time_shared_makespan, checked
    # by hand in test_scaling_formulas.py). It lies between the cores' work, 2 x 4 x 1.4 = 11.2 ms,
    # and the whole 9.8 ms makespan at half speed, 19.6 ms.
    got = predict(run, Layout(pp=4))
    third = 1.4 * MS / 3
    assert got == pytest.approx(time_shared_makespan([third] * 4, [2 * third] * 4, microbatches=4, cores=2,
                                                     message_s=0.0))  # fmt: skip
    assert 11.2 * MS < got < 19.6 * MS
    # 2 stages on 2 cores (c = 1): the span, as on a GPU.
    assert predict(run, Layout(pp=2)) == pytest.approx(12 * MS)


def test_best_layout_and_its_reason() -> None:
    run = summary(step=12 * MS, data=1 * MS, compute=10 * MS, busy=3 * MS, exposed=1 * MS,
                  lowRank={"bytesPerRank": 10_000, "uncompressedBytes": 1_000})  # fmt: skip
    fc = forecast(measured_from_summary(run, source="run"), sizes=(1, 64))
    choice = best_at(fc, 64)
    assert choice.point.family == "data+powersgd"
    assert "exposed communication" in choice.reason and "N=64" in choice.reason
    assert "tensor" in fc.missing and "pipeline" in fc.missing  # nothing known about them for this model
    with pytest.raises(ValueError, match="was not forecast"):
        best_at(fc, 128)


def test_the_best_alternative_at_the_runs_own_size() -> None:
    # 100 MB/s: the all-reduce at 8 ranks takes 2 x 7/8 x 10 ms = 17.5 ms; busy 18.5 -> R = 1 ms,
    # W = 8 ms, exposed 10.5 ms: the step 21.5 ms. PowerSGD sends 2 x 10 kB + 1 kB (2.1 %) in 12 calls:
    # 1 + 0.3675 ms, hidden but for the last call's share: 11.114 ms
    run = summary(world=8, step=21.5 * MS, data=1 * MS, compute=10 * MS, busy=18.5 * MS, exposed=10.5 * MS,
                  link={"alphaS": 0.0, "betaBytesPerS": 1e8, "worldSize": 8},
                  lowRank={"bytesPerRank": 10_000, "uncompressedBytes": 1_000})  # fmt: skip
    fc = forecast(measured_from_summary(run, source="run"), sizes=(1, 8))
    alt = best_alternative(fc)
    assert alt is not None and alt.best.layout == Layout(dp=8, compression="powersgd")
    assert alt.current.step_s == pytest.approx(21.5 * MS)
    assert alt.best.step_s == pytest.approx(11 * MS + (1 + 0.3675) * MS / 12)
    assert alt.gain == pytest.approx(alt.current.step_s / alt.best.step_s - 1)
    # one worker: every family's layout at N = 1 is the run's own, nothing is faster
    one = forecast(measured_from_summary(ONE_RANK, source="one"), link=Link(alpha_s=0.0, beta_bytes_per_s=1e9))
    assert best_alternative(one) is None


def test_a_single_rank_run_needs_a_bandwidth() -> None:
    m = measured_from_summary(ONE_RANK, source="one")
    with pytest.raises(InputError, match="--bandwidth"):
        forecast(m)
    fc = forecast(m, link=Link(alpha_s=0.0, beta_bytes_per_s=1e9), sizes=(1, 2))
    assert fc.points[(2, "data")].step_s == pytest.approx(11 * MS)  # 10 + 1 ms all-reduce, no overlap known


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda s: s.update(mode="federated"), "federated and parameter-server jobs are not modelled"),
        (lambda s: s.pop("scaling"), "no 'scaling' block"),
        (lambda s: s["scaling"]["perStep"].update(stepS=0.0), "measured no steps"),
        (lambda s: s.update(layout="two replicas"), "not 'dp=D,pp=P,tp=T'"),
        (lambda s: s["scaling"].pop("host"), "scaling.host is missing"),
        (lambda s: s["scaling"]["perStep"].update(computeS="fast"), "expected"),
    ],
)
def test_bad_summaries_name_what_is_missing(change: Any, message: str) -> None:
    s = summary(step=12 * MS, compute=10 * MS)
    change(s)
    with pytest.raises(InputError, match=message):
        measured_from_summary(s, source="RUN")


def _communication_bound_run() -> dict[str, Any]:
    """The case above: PowerSGD forecast to halve the step of a run that waits on the link half the time."""
    run = summary(world=8, step=21.5 * MS, data=1 * MS, compute=10 * MS, busy=18.5 * MS, exposed=10.5 * MS,
                  link={"alphaS": 0.0, "betaBytesPerS": 1e8, "worldSize": 8},
                  lowRank={"bytesPerRank": 10_000, "uncompressedBytes": 1_000})  # fmt: skip
    return {**run, "commExposedFraction": 10.5 / 21.5}


def test_the_hint_names_the_change_forecast_to_help_most() -> None:
    run = _communication_bound_run()
    gain = 21.5 / (11 + 1.3675 / 12) - 1  # the best alternative's, by hand above: +93%
    assert scaling_hint(run, world_size=8) == (f"exposed communication 49% of the step: dp8 powersgd forecast "
                                               f"+{gain:.0%} samples/s over dp8")  # fmt: skip
    assert scaling_hint({**run, "commExposedFraction": 0.2}, world_size=8) is None  # below the threshold
    assert scaling_hint(run, world_size=4) is None  # not the job's own world size
    assert scaling_hint({**run, "mode": "federated"}, world_size=8) is None  # not modelled
    assert scaling_hint({**run, "dataStrategy": "fsdp"}, world_size=8) is None  # no compression hook to change
    assert scaling_hint({**run, "layout": "dp=4,pp=1,tp=2", "mode": "hybrid"}, world_size=8) is None
    assert scaling_hint({**run, "scaling": "cut short"}, world_size=8) is None
    assert scaling_hint(None, world_size=8) is None


def test_a_finished_job_gets_the_hint_in_status_and_one_event() -> None:
    spec = api.parse_spec({"mode": "data", "workers": {"replicas": 8}})
    status = {"phase": "Running", "attempt": 0, "replicas": 8, "restarts": 0, "lastSpecReplicas": 8,
              "observedGeneration": 1, "startTime": "2026-01-01T11:59:00Z",
              "conditions": [{"type": "Running", "status": "True", "reason": "GangRunning"}]}  # fmt: skip
    pods = [PodView(name=f"j-worker-{i}", role="worker", index=i, attempt=0, phase="Succeeded", scheduled=True,
                    exit_code=0, message=json.dumps(_communication_bound_run()) if i == 0 else "")
            for i in range(8)]  # fmt: skip
    plan = decide(Observed(generation=1, spec=spec, accepted=spec, status=status, pods=pods,
                           now=datetime(2026, 1, 1, 12, 0, tzinfo=UTC)))  # fmt: skip
    assert plan.status["phase"] == "Succeeded" and plan.status["hint"].startswith("exposed communication 49%")
    assert [(k, r, m) for k, r, m in plan.events if r == "ScalingHint"] == [("Normal", "ScalingHint", plan.status["hint"])]
