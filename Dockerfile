# syntax=docker/dockerfile:1
# disttrain images. Two targets from one base:
#   trainer  - torch (CPU wheel, pinned), grpcio and the project with its [trainer] extra
#   operator - kopf and the project with its [operator] extra; no torch
# Dependencies come from a wheelhouse prepared on the host (`make wheelhouse`: build/wheels,
# torch pinned), bind-mounted into the RUN steps so no wheel or pip cache ends up in a layer.
# BASE_IMAGE: any Debian-like image with python3 >= 3.11 and its venv module. The local
# cluster passes a debootstrap-built bookworm; a CUDA runtime image works for GPU nodes.
ARG BASE_IMAGE=python:3.11-slim

FROM ${BASE_IMAGE} AS base
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
# --no-index: the wheelhouse is the pin set (torch==2.13.0 CPU among them).
RUN --mount=type=bind,source=build/wheels,target=/wheels \
    pip install --no-cache-dir --no-index --find-links=/wheels "disttrain[trainer]" \
 && python -c "import torch, disttrain_api, disttrain_trainer"
USER 10001:10001
CMD ["python", "-m", "disttrain_trainer"]

FROM base AS operator
RUN --mount=type=bind,source=build/wheels,target=/wheels \
    pip install --no-cache-dir --no-index --find-links=/wheels "disttrain[operator]" \
 && python -c "import kopf, disttrain_operator"
USER 10001:10001
CMD ["disttrain", "operator"]
