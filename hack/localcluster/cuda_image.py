"""The CUDA trainer image (`make image-cuda`): the root Dockerfile's `trainer` target with PyPI's
CUDA build of torch, built with buildah exactly as the local cluster's CPU images are, then
checked without a GPU.

Not part of `make test`: the image is several GB (torch's CUDA wheels carry cuBLAS, cuDNN, NCCL,
...), and the local cluster has no GPU to run it on. It stays in buildah's store under
CUDA_TRAINER_IMAGE; `buildah push` sends it to a registry (README "GPU").

What is checked inside it, with no GPU and no driver: torch imports, reports the CUDA version it
was built for (`torch.version.cuda`) and the cuDNN it carries (`torch.backends.cudnn.version()`
loads libcudnn from the wheel), and the trainer and API packages import.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass

from . import images
from .config import REPO_ROOT
from .proc import ClusterError, run, say

CUDA_TRAINER_IMAGE = "localhost/disttrain-trainer:dev-cuda"
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
    base = images.BASE_IMAGE
    images.base_image()
    images.wheelhouse()  # the project wheel and its CPU-torch dependency set; torch comes from torch_index
    t0 = time.monotonic()
    run([*images.BUILDAH, "bud", "--isolation", "chroot", "--pull=never", "-f", REPO_ROOT / "Dockerfile",
         "--target", "trainer", "--build-arg", f"BASE_IMAGE={base}", "--build-arg", f"TORCH_INDEX_URL={torch_index}",
         "-t", ref, REPO_ROOT], step=step, log=log, timeout=3600)  # fmt: skip
    build_s = time.monotonic() - t0
    found = check(ref)
    image = CudaImage(ref=ref, torch=found["torch"], cuda=found["cuda"], cudnn=int(found["cudnn"]),
                      nccl=found["nccl"], size_bytes=size_bytes(ref), build_s=round(build_s, 1))  # fmt: skip
    # Dangling images of earlier builds hold several GB each in the vfs store.
    run([*images.BUILDAH, "rmi", "--prune"], step=step, log=log, timeout=600, check=False)
    return image


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
    """The image's unpacked size: the sum of its layers' sizes in buildah's store."""
    log, step = images.log_path(), "image trainer-cuda (size)"
    listed = json.loads(run([*images.BUILDAH, "images", "--json", ref], step=step, log=log).stdout)
    return int(listed[0]["size"])


def main(torch_index: str) -> int:
    image = build(torch_index)
    say(f"{image.ref}: torch {image.torch}, CUDA {image.cuda}, cuDNN {image.cudnn}, NCCL {image.nccl}; "
        f"{image.size_bytes / 1e9:.2f} GB; built in {image.build_s:.0f}s")
    print(json.dumps(asdict(image)))
    return 0
