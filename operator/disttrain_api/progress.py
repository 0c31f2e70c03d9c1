"""A job's progress as users read it (`status.progress`, `disttrain local`): how far, how fast,
and when it will finish. Pure arithmetic over two readings of the completed count; the
operator feeds it rank 0's scraped step (the aggregator's round), `disttrain local` the
trainer's metrics log, so both report the same figures.

The rate is the recent one, not the run's mean: each update measures the rate over the
window since the previous update, and blends it into the previous rate, each window weighted by
its length, a weight that halves every RATE_HALF_LIFE_S after it (`blend`; the block keeps the
weight the rate stands for, `rateSeconds`). So a run observed for less than a half-life gets
about its mean since its first reading (a short first window, often a slow one, does not
outweigh the ones after it), and a long run the rate of its last minute or so. A run that slowed down (a smaller gang
after an elastic shrink, a contended node, a slower phase of a schedule) gets an ETA from
its present speed within a minute or so, which a whole-run mean would take the rest of the
run to learn. A count that goes back (a gang resumed from an older checkpoint) starts the
rate over.

What the ETA adds up: the steps left at the recent rate, and the seconds the run takes after its
last step (the final evaluation, the export, the final checkpoint), which rank 0 estimates from
their measured costs and exports (metric_names.FINISH_SECONDS, `finish_s` in its metrics log).
Start-up is kept out of the rate: the trainer reports no step count before its first log interval
(data preparation, model build), and a restarted gang's first reading re-anchors the window
(`restarted`) so the pause between two gangs never counts as a slow window; the rate measured
before the restart stands until the new gang's second reading.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from .model import JobSpec

# The operator writes a job's progress at most once per this many seconds (a progress-only
# status change; transitions are written at once and carry the latest progress).
PROGRESS_INTERVAL_S = 10.0
# The previous rate's share of the blended rate halves every this many seconds of window.
RATE_HALF_LIFE_S = 30.0


@dataclass(frozen=True, kw_only=True)
class Basis:
    """What one unit of progress is for this job, from its spec."""

    unit: str  # "steps" or "rounds" (federated)
    total: int
    samples_per_unit: int | None  # a global batch per step; None for federated rounds
    tokens_per_sample: int | None  # a language model's context length; None for other models
    # Whether the trainer's summary reports the whole job's samplesPerS (the collective modes); a
    # parameter-server worker's is its own, idle waits included.
    summary_is_job_wide: bool = True


def basis_for(spec: JobSpec) -> Basis:
    if spec.mode == "federated" and spec.federated is not None:
        # A round's samples are the sampled clients' local epochs: not a fixed count.
        return Basis(unit="rounds", total=spec.federated.rounds, samples_per_unit=None, tokens_per_sample=None,
                     summary_is_job_wide=False)  # fmt: skip
    # Every other mode's step consumes one global batch (a parameter-server iteration: one
    # slice of it per worker, worker 0's count standing for all).
    tokens = spec.model.block_size if spec.model.name == "gpt" or spec.model.hf_dir is not None else None
    return Basis(unit="steps", total=spec.training.steps, samples_per_unit=spec.data.batch_size,
                 tokens_per_sample=tokens, summary_is_job_wide=spec.mode != "paramserver")  # fmt: skip


def format_time(value: datetime) -> str:
    """RFC 3339 in UTC to the millisecond: the next window is measured from it."""
    return value.strftime("%Y-%m-%dT%H:%M:%S.") + f"{value.microsecond // 1000:03d}Z"


def parse_time(value: object) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else None


def format_eta(seconds: float | None) -> str | None:
    """`45s`, `12m05s`, `3h07m`, `2d04h`: the ETA printer column."""
    if seconds is None:
        return None
    s = max(0, int(round(seconds)))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def blended_rate(prev_rate: float | None, window_rate: float, window_s: float,
                 half_life_s: float = RATE_HALF_LIFE_S) -> float:  # fmt: skip
    """The recent rate: `window_rate` (measured over the last `window_s`) weighted against the
    previous rate by how long the window was, w = 1 - 2^(-window / half-life). A window of one
    half-life counts as much as everything before it."""
    if prev_rate is None:
        return window_rate
    w = 1.0 - 0.5 ** (window_s / half_life_s)
    return w * window_rate + (1.0 - w) * prev_rate


def blend(prev_rate: float | None, prev_seconds: float | None, window_rate: float, window_s: float,
          half_life_s: float = RATE_HALF_LIFE_S) -> tuple[float, float]:  # fmt: skip
    """(rate, seconds): the windows' rates averaged by their lengths, each length halved every
    `half_life_s` since; `prev_seconds` is the weight `prev_rate` stands for (None: a block written
    before it was kept, taken as the steady state: blended_rate). In the steady state (windows of
    one length) it is blended_rate."""
    if prev_rate is None:
        return window_rate, window_s
    if prev_seconds is None:
        return blended_rate(prev_rate, window_rate, window_s, half_life_s), window_s / (1.0 - 0.5 ** (window_s / half_life_s))
    kept = prev_seconds * 0.5 ** (window_s / half_life_s)
    total = kept + window_s
    return (prev_rate * kept + window_rate * window_s) / total, total


def _num(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def build(prev: dict[str, object] | None, *, completed: int, basis: Basis, now: datetime,
          mfu: float | None = None, finish_s: float | None = None) -> dict[str, object]:  # fmt: skip
    """The progress block after a reading of `completed` units at `now`; `prev`: the block
    last reported (its count and time are the start of this window); `finish_s`: the seconds
    after the last step, as the trainer estimates them (added to the ETA).

    The same count as before returns `prev` unchanged (its time stays that of the last
    advance): a stalled job is not rewritten, and its next advance is measured over the stall.
    A `prev` that `restarted` returned is an anchor only: its rate carries over."""
    prev = prev if isinstance(prev, dict) else None
    prev_done, prev_time = (_num(prev.get("completed")), parse_time(prev.get("lastUpdateTime"))) if prev else (None, None)
    if prev is not None and prev_time is not None and prev_done == completed and prev.get("total") == basis.total:
        return prev
    rate: float | None = None
    weight: float | None = None
    if prev is not None and prev_time is None:  # the first reading of a restarted gang: the window starts here
        rate, weight = _num(prev.get("rate")), _num(prev.get("rateSeconds"))
    elif prev_done is not None and prev_time is not None and completed > prev_done:
        window_s = (now - prev_time).total_seconds()
        if window_s > 0:
            rate, weight = blend(_num(prev.get("rate")) if prev else None, _num(prev.get("rateSeconds")) if prev else None,
                                 (completed - prev_done) / window_s, window_s)  # fmt: skip
    block = _block(completed=completed, basis=basis, rate=rate, now=now, mfu=mfu, finish_s=finish_s)
    if rate is not None and weight is not None:
        block["rateSeconds"] = round(weight, 3)
    return block


def restarted(prev: dict[str, object] | None) -> dict[str, object] | None:
    """The block of a job whose gang was just restarted: its figures stay on show, but it no longer
    anchors a window (its time is dropped): the next reading, the new gang's first, starts one,
    with the rate measured before the restart until then."""
    if not isinstance(prev, dict):
        return prev
    return {k: v for k, v in prev.items() if k != "lastUpdateTime"}


def finished(prev: dict[str, object] | None, *, completed: int, basis: Basis, now: datetime,
             result: dict[str, object] | None) -> dict[str, object]:  # fmt: skip
    """The block of a job that succeeded: nothing remains; its throughput is the trainer's own
    figure for the whole run (the summary's samplesPerS, tokensPerS, mfu) where that is the whole
    job's, else the last recent rate's."""
    block = _block(completed=completed, basis=basis, rate=_num(prev.get("rate")) if isinstance(prev, dict) else None,
                   now=now, mfu=None, eta_s=0.0)  # fmt: skip
    keys = (("samplesPerS", "samplesPerSecond"), ("tokensPerS", "tokensPerSecond"), ("mfu", "mfu"))
    for key, field_name in keys if basis.summary_is_job_wide else keys[2:]:
        value = _num((result or {}).get(key))
        if value is not None:
            block[field_name] = round(value, 4 if key == "mfu" else 1)
    return block


def _block(*, completed: int, basis: Basis, rate: float | None, now: datetime, mfu: float | None,
           eta_s: float | None = None, finish_s: float | None = None) -> dict[str, object]:  # fmt: skip
    total = basis.total
    block: dict[str, object] = {
        "completed": completed,
        "total": total,
        "unit": basis.unit,
        "percent": round(min(100.0, 100.0 * completed / total), 1) if total > 0 else 0.0,
        "lastUpdateTime": format_time(now),
    }
    if rate is not None and rate > 0:
        block["rate"] = round(rate, 4)
        if basis.samples_per_unit is not None:
            samples = rate * basis.samples_per_unit
            block["samplesPerSecond"] = round(samples, 1)
            if basis.tokens_per_sample is not None:
                block["tokensPerSecond"] = round(samples * basis.tokens_per_sample, 1)
        if eta_s is None:
            eta_s = max(0, total - completed) / rate + max(0.0, finish_s or 0.0)
    if eta_s is not None:
        block["etaSeconds"] = int(round(eta_s))
        block["eta"] = format_eta(eta_s)
    if mfu is not None:
        block["mfu"] = round(mfu, 4)
    return block


def describe(block: dict[str, object]) -> str:
    """One line for a log: `step 120/400 (30.0%), 1,234 samples/s, ETA 4m10s`."""
    unit = "round" if block.get("unit") == "rounds" else "step"
    parts = [f"{unit} {block.get('completed')}/{block.get('total')} ({block.get('percent')}%)"]
    samples, tokens, mfu = (_num(block.get(k)) for k in ("samplesPerSecond", "tokensPerSecond", "mfu"))
    if samples is not None:
        parts.append(f"{samples:,.0f} samples/s")
    if tokens is not None:
        parts.append(f"{tokens:,.0f} tokens/s")
    if mfu is not None:
        parts.append(f"MFU {mfu:.1%}")
    parts.append(f"ETA {block['eta']}" if block.get("eta") else "ETA -")
    return ", ".join(parts)
