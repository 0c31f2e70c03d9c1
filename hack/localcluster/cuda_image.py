"""The CUDA trainer image (`make image-cuda`): the root Dockerfile's `trainer` target with PyPI's
CUDA build of torch, built with buildah exactly as the local cluster's CPU images are, then
checked without a GPU.

The build container has no network of its own here (the host's TLS trust is not in the base
image), and needs none: the host downloads torch's CUDA build and its nvidia-* wheels into
build/wheels-cuda beside hard links to the CPU wheelhouse's other wheels, and the Dockerfile
installs from that wheelhouse (`--build-arg WHEELS=build/wheels-cuda`) as it does for the CPU image.

Not part of `make test`: the image is several GB (torch's CUDA wheels carry cuBLAS, cuDNN, NCCL,
...), and the local cluster has no GPU to run it on. It stays in buildah's store under
CUDA_TRAINER_IMAGE; `buildah push` sends it to a registry (README "GPU").

What is checked inside it, with no GPU and no driver: torch imports, reports the CUDA version it
was built for (`torch.version.cuda`) and the cuDNN it carries (`torch.backends.cudnn.version()`
loads libcudnn from the wheel), and the trainer and API packages import.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from . import images
from .config import REPO_ROOT
from .proc import ClusterError, run, say

CUDA_TRAINER_IMAGE = "localhost/disttrain-trainer:dev-cuda"
CUDA_WHEELS = REPO_ROOT / "build" / "wheels-cuda"
TORCH_VERSION = "2.13.0"  # the project's pin (pyproject.toml)
# PyPI's Linux x86_64 torch is a CUDA build (its nvidia-* wheels are dependencies), so PyPI
# itself is the index; https://download.pytorch.org/whl/cu1XX picks another CUDA version.
DEFAULT_TORCH_INDEX = "https://pypi.org/simple"
# Printed by the check as one JSON line: what the image's torch was built with.
CHECK_SCRIPT = (
    "import json, torch, disttrain_api, disttrain_trainer; "
    "print(json.dumps({'torch': torch.__version__, 'cuda': torch.version.cuda, "
    "'cudnn': torch.backends.cudnn.version(), 'nccl': '.'.join(map(str, torch.cuda.nccl.version())) "
    "if torch.version.cuda else None, 'cuda_available': torch.cuda.is_available()}))"
)


@dataclass(frozen=True, kw_only=True)
class CudaImage:
    ref: str
    torch: str
    cuda: str
    cudnn: int
    nccl: str
    size_bytes: int
    build_s: float


def build(torch_index: str = DEFAULT_TORCH_INDEX, ref: str = CUDA_TRAINER_IMAGE) -> CudaImage:
    """Build the CUDA trainer image, check it, and return what it holds; raises ClusterError
    when the build fails or the image's torch is not a CUDA build."""
    log, step = images.log_path(), "image trainer-cuda (buildah bud)"
    images.base_image()
    t0 = time.monotonic()
    wheels = cuda_wheelhouse(torch_index)
    run([*images.BUILDAH, "bud", "--isolation", "chroot", "--pull=never", "-f", REPO_ROOT / "Dockerfile",
         "--target", "trainer", "--build-arg", f"BASE_IMAGE={images.BASE_IMAGE}",
         "--build-arg", f"WHEELS={wheels.relative_to(REPO_ROOT)}", "-t", ref, REPO_ROOT],
        step=step, log=log, timeout=3600)  # fmt: skip
    build_s = time.monotonic() - t0
    found = check(ref)
    image = CudaImage(ref=ref, torch=found["torch"], cuda=found["cuda"], cudnn=int(found["cudnn"]),
                      nccl=found["nccl"], size_bytes=size_bytes(ref), build_s=round(build_s, 1))  # fmt: skip
    # Dangling images of earlier builds hold several GB each in the vfs store.
    run([*images.BUILDAH, "rmi", "--prune"], step=step, log=log, timeout=600, check=False)
    return image


def cuda_wheelhouse(torch_index: str) -> Path:
    """build/wheels-cuda: torch TORCH_VERSION and its CUDA wheels from `torch_index` (downloaded
    once per index), plus hard links to every other wheel of the CPU wheelhouse."""
    log, step = images.log_path(), "wheelhouse (CUDA torch)"
    images.wheelhouse()
    CUDA_WHEELS.mkdir(parents=True, exist_ok=True)
    stamp = CUDA_WHEELS / ".torch.json"
    recorded = json.loads(stamp.read_text()) if stamp.exists() else {}
    if recorded.get("index") != torch_index:
        for old in CUDA_WHEELS.glob("*.whl"):
            old.unlink()
        t0 = time.monotonic()
        # --isolated: not this machine's pip configuration, whose local find-links hold the CPU
        # build of the same version (2.13.0+cpu, which sorts above 2.13.0). The system CA bundle
        # still applies: the way out may be a TLS-inspecting proxy that the host trusts.
        cert = os.environ.get("PIP_CERT") or "/etc/ssl/certs/ca-certificates.crt"
        run([sys.executable, "-m", "pip", "download", "--isolated", "-q", *(["--cert", cert] if Path(cert).exists() else []),
             "--index-url", torch_index, "--only-binary", ":all:", "-d", CUDA_WHEELS, f"torch=={TORCH_VERSION}"],
            step=step, log=log, timeout=3600)  # fmt: skip
        recorded = {"index": torch_index, "wheels": sorted(p.name for p in CUDA_WHEELS.glob("*.whl"))}
        stamp.write_text(json.dumps(recorded))
        say(f"CUDA torch wheels downloaded in {time.monotonic() - t0:.1f}s "
            f"({sum(p.stat().st_size for p in CUDA_WHEELS.glob('*.whl')) / 1e9:.2f} GB)")
    downloaded = set(recorded["wheels"])
    for old in CUDA_WHEELS.glob("*.whl"):
        if old.name not in downloaded:
            old.unlink()  # links of an earlier CPU wheelhouse (a project wheel since rebuilt)
    # torch and whatever its CUDA build needs come from the CUDA index; the rest from the CPU set.
    from_index = {_project(name) for name in downloaded}
    for wheel in images.WHEELS.glob("*.whl"):
        if _project(wheel.name) not in from_index:
            os.link(wheel, CUDA_WHEELS / wheel.name)
    return CUDA_WHEELS


def _project(wheel_name: str) -> str:
    """A wheel file's normalised project name (PEP 427: `{name}-{version}-...whl`)."""
    return wheel_name.split("-", 1)[0].lower().replace(".", "_")


def check(ref: str) -> dict[str, object]:
    """Run CHECK_SCRIPT inside the image (no GPU needed); the parsed line."""
    log, step = images.log_path(), "image trainer-cuda (check)"
    ctr = run([*images.BUILDAH, "from", "--pull=never", ref], step=step, log=log).stdout.strip().splitlines()[-1]
    try:
        out = run([*images.BUILDAH, "run", "--isolation", "chroot", ctr, "--", "python", "-c", CHECK_SCRIPT],
                  step=step, log=log, timeout=300).stdout  # fmt: skip
    finally:
        run([*images.BUILDAH, "rm", ctr], step=step, log=log, check=False)
    found: dict[str, object] = json.loads(out.strip().splitlines()[-1])
    if not found.get("cuda") or not found.get("cudnn"):
        raise ClusterError(f"{ref}: torch {found.get('torch')} is not a CUDA build (torch.version.cuda="
                           f"{found.get('cuda')!r}, cudnn={found.get('cudnn')!r}); is TORCH_INDEX_URL a CUDA index?")
    return found


def size_bytes(ref: str) -> int:
    """The image's unpacked size in bytes: the sum of its layers' diff sizes in buildah's store
    (`buildah images` only prints a rounded "5.9 GB")."""
    log, step = images.log_path(), "image trainer-cuda (size)"
    inspected = json.loads(run([*images.BUILDAH, "inspect", "--type", "image", ref], step=step, log=log).stdout)
    diff_ids = inspected["OCIv1"]["rootfs"]["diff_ids"]
    graph_root = run([*images.BUILDAH, "info", "--format", "{{.store.GraphRoot}}"], step=step, log=log).stdout.strip()
    layers = json.loads((Path(graph_root) / "vfs-layers" / "layers.json").read_text())
    sizes = {layer["diff-digest"]: int(layer["diff-size"]) for layer in layers if "diff-digest" in layer}
    return sum(sizes[d] for d in diff_ids)


def main(torch_index: str) -> int:
    image = build(torch_index)
    say(f"{image.ref}: torch {image.torch}, CUDA {image.cuda}, cuDNN {image.cudnn}, NCCL {image.nccl}; "
        f"{image.size_bytes / 1e9:.2f} GB; built in {image.build_s:.0f}s")
    print(json.dumps(asdict(image)))
    return 0
