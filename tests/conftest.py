"""Suite-wide policy.

Under CI=true no tier may silently skip: a skip in the dist, cluster or e2e
tiers becomes a failure that says why. Only tests marked `gpu` may skip (CI
never has a GPU).
"""

from __future__ import annotations

import os

import pytest

STRICT_TIERS = ("dist", "cluster", "e2e")


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    outcome = yield
    report = outcome.get_result()
    if not in_ci() or not report.skipped or item.get_closest_marker("gpu"):
        return
    if any(item.get_closest_marker(tier) for tier in STRICT_TIERS):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"CI=true forbids skipping this tier: {reason}"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # The tier is the folder: tests/dist -> dist, tests/cluster -> cluster, tests/e2e -> e2e.
    for item in items:
        parts = item.path.parts
        for tier in STRICT_TIERS:
            if tier in parts[parts.index("tests") + 1 :][:1]:
                item.add_marker(getattr(pytest.mark, tier))
