# syntax=docker/dockerfile:1
# disttrain images. Two targets from one base:
#   trainer  - torch (CPU wheel, pinned), grpcio and the project with its [trainer] extra
#   operator - kopf and the project with its [operator] extra; no torch
# Dependencies come from a wheelhouse prepared on the host (`make wheelhouse`: build/wheels,
# torch pinned), bind-mounted into the RUN steps so no wheel or pip cache ends up in a layer.
# BASE_IMAGE: any Debian-like image with the wheelhouse's Python (3.11) and its venv module. The
# local cluster passes a debootstrap-built bookworm. A CUDA runtime image (nvidia/cuda:...) works
# too, but is not needed: torch's CUDA wheels carry their CUDA libraries and the node's NVIDIA
# container runtime mounts the driver. APT_PACKAGES installs what such a base lacks
# (e.g. "python3.11 python3.11-venv").
#
# CUDA trainer (README "GPU"): TORCH_INDEX_URL names an index with a CUDA build of torch
# TORCH_VERSION (PyPI's Linux torch is one; https://download.pytorch.org/whl/cu130 picks a
# CUDA version); empty (the default) keeps the wheelhouse's CPU torch. Or, with no network in
# the build, WHEELS names a wheelhouse that holds a CUDA torch already (`make image-cuda`:
# build/wheels-cuda). The [trainer] extra brings torchao (training.float8) into both: its float8
# path is Python over torch._scaled_mm, so the same wheel serves the CPU and the CUDA torch (the
# CPU image refuses float8 at start anyway).
ARG BASE_IMAGE=python:3.11-slim

FROM ${BASE_IMAGE} AS base
ARG APT_PACKAGES=""
# DL3008 (pin apt versions): the packages are the caller's, pinned there if wanted ("pkg=ver").
# hadolint ignore=DL3008
RUN if [ -n "${APT_PACKAGES}" ]; then \
      apt-get update \
      && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends ${APT_PACKAGES} \
      && rm -rf /var/lib/apt/lists/*; \
    fi
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
# Numeric non-root user, so pods can use runAsNonRoot without naming a UID.
RUN python3 -m venv /opt/venv \
 && groupadd --gid 10001 disttrain \
 && useradd --uid 10001 --gid 10001 --create-home --home-dir /home/disttrain --shell /usr/sbin/nologin disttrain
WORKDIR /home/disttrain

FROM base AS trainer
ARG TORCH_INDEX_URL=""
ARG TORCH_VERSION=2.13.0
ARG WHEELS=build/wheels
# --no-index: the wheelhouse is the pin set (torch==2.13.0 CPU among them). A CUDA torch
# installed first satisfies the same pin (2.13.0+cuXXX == 2.13.0), so the wheelhouse keeps it.
RUN --mount=type=bind,source=${WHEELS},target=/wheels \
    if [ -n "${TORCH_INDEX_URL}" ]; then \
      pip install --no-cache-dir --index-url "${TORCH_INDEX_URL}" "torch==${TORCH_VERSION}"; \
    fi \
 && pip install --no-cache-dir --no-index --find-links=/wheels "disttrain[trainer]" \
 && python -c "import torch, disttrain_api, disttrain_trainer; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
# The NVIDIA container runtime mounts the driver's compute libraries only when asked to.
ENV NVIDIA_DRIVER_CAPABILITIES=compute,utility
USER 10001:10001
CMD ["python", "-m", "disttrain_trainer"]

FROM base AS operator
RUN --mount=type=bind,source=build/wheels,target=/wheels \
    pip install --no-cache-dir --no-index --find-links=/wheels "disttrain[operator]" \
 && python -c "import kopf, disttrain_operator, disttrain_cli"
USER 10001:10001
CMD ["disttrain", "operator"]
