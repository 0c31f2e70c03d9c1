"""Scaling forecast: from one run's measurements, step time and efficiency at other sizes and layouts.

Pure arithmetic over plain data (stdlib only): the CLI (`disttrain explain`), the operator
and the trainer's link probe all call it. Public entry points:

  measured_from_summary(summary, source=...) -> Measured   parse a trainer summary / status.result
  forecast(measured, single=..., link=..., ranks_per_host=..., own_cores=..., sizes=...) -> Forecast
  best_at(forecast, n) -> Choice                            the fastest layout at n, with a reason
  Forecast.at(n) -> [Point]                                 every family at n, fastest first
  best_alternative(forecast) -> Alternative | None          a faster layout at the run's own size, and
                                                            its samples/s gain (an operator's hint)
  fit_link(n, [(bytes, seconds)]) -> Link                   alpha-beta from timed all-reduces
  collectives.*, pipeline_time.*                            the formulas themselves
"""

from __future__ import annotations

from .collectives import Link, Topology, fit_link
from .forecast import (
    FAMILIES,
    SIZES,
    Alternative,
    Choice,
    Forecast,
    Point,
    best_alternative,
    best_at,
    forecast,
    run_layout,
)
from .inputs import InputError, Measured, measured_from_summary
from .model import Breakdown, Layout, Placement

__all__ = [
    "FAMILIES",
    "Alternative",
    "SIZES",
    "Breakdown",
    "Choice",
    "Forecast",
    "InputError",
    "Layout",
    "Link",
    "Measured",
    "Placement",
    "Point",
    "Topology",
    "best_alternative",
    "best_at",
    "fit_link",
    "forecast",
    "measured_from_summary",
    "run_layout",
]
