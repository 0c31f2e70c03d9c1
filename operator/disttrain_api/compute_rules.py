"""Cross-field rules of the compute switches: training.compile and training.float8."""

from __future__ import annotations

from .model import JobSpec
from .rule_checker import Checker

# The modes whose step loops compile (modes/data, modes/pipeline). Federated clients and
# parameter-server workers run their own CPU loops (local rounds, pull/push), which do not.
COMPILE_MODES = ("data", "tensor", "hybrid", "pipeline")


def compute(spec: JobSpec, c: Checker) -> None:
    tr = spec.training
    if c.ok("spec.training.compile", "spec.mode") and tr.compile_mode is not None and spec.mode not in COMPILE_MODES:
        c.add("spec.training.compile", f"applies to modes {', '.join(COMPILE_MODES)}; mode {spec.mode} trains in a "
              "loop of its own that does not compile (set compile: false)")  # fmt: skip
    if not (tr.float8 and c.ok("spec.training.float8")):
        return
    if c.ok("spec.workers.resources.gpus") and spec.workers.resources.gpus == 0:
        c.add("spec.training.float8", "needs GPUs of compute capability 8.9 or newer (Ada, Hopper): "
              "workers.resources.gpus is 0")  # fmt: skip
    if not c.ok("spec.mode", "spec.parallelism.tensor", "spec.parallelism.pipeline"):
        return
    par = spec.parallelism
    if spec.mode not in ("data", "hybrid", "tensor") or par.tensor > 1 or par.pipeline > 1:
        c.add("spec.training.float8", "runs with data parallelism (ddp or fsdp) only: tensor parallelism would need "
              "torchao's float8 tensor-parallel styles and pipeline stages float8 boundaries, which this trainer "
              f"does not wire (mode {spec.mode}, tensor {par.tensor}, pipeline {par.pipeline})")  # fmt: skip
