"""Read training progress from rank 0's Prometheus endpoint (pod IP : metrics port)."""

from __future__ import annotations

import urllib.error
import urllib.request

from disttrain_api.metric_names import PROGRESS_SERIES as SERIES

from .observe import parse_prometheus


def scrape(ip: str, port: int, timeout_s: float = 1.5) -> dict[str, float] | None:
    """disttrain_step / disttrain_last_checkpoint_step, or None when unreachable (e.g. the
    operator runs outside a cluster whose pod network it cannot route to)."""
    if not ip:
        return None
    try:
        with urllib.request.urlopen(f"http://{ip}:{port}/metrics", timeout=timeout_s) as resp:  # noqa: S310
            text = resp.read().decode("utf-8", "replace")
    except (OSError, urllib.error.URLError, ValueError):
        return None
    found = parse_prometheus(text, SERIES)
    return found or None
