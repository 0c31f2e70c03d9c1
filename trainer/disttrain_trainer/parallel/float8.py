"""training.float8: torchao's float8 training for the linear layers (Micikevicius et al. 2022;
torchao.float8, as torchtitan uses it).

Each selected nn.Linear becomes a Float8Linear: its input, weight and output gradient are cast to
float8 with a dynamic per-tensor scale and multiplied on the tensor cores (`torch._scaled_mm`),
master weights and optimizer state stay in their own precision. With FSDP2 the weights are
all-gathered as float8 (`enable_fsdp_float8_all_gather`): half the bytes of bf16 on the wire.

Which layers: float8 matmuls need both dimensions to be multiples of 16, and for small ones the
casts cost more than the faster matmul saves. The filter is torchao's heuristic for tensorwise
scaling (measured on H100: a layer with K <= 4096 input and N <= 1024 output features is left in
high precision), and the output head is never converted (its rows are the vocabulary, and its
logits feed the loss: torchtitan leaves it out too).

The device: float8 tensor cores exist from compute capability 8.9 (Ada, Hopper) on; anywhere else
the job is refused at start (exit 2) with the device named, rather than emulated slowly.
"""

from __future__ import annotations

import torch
from torch import nn

from ..process.config import ConfigError

MULTIPLE = 16
# torchao's tensorwise heuristic (torchao/float8/float8_linear_utils.py, _auto_filter_for_tensorwise).
SMALL_IN, SMALL_OUT = 4096, 1024
SKIPPED_FQNS = ("head", "lm_head", "output")
MIN_CAPABILITY = (8, 9)


def converts(module: nn.Module, fqn: str) -> bool:
    """Whether the float8 conversion swaps this module (torchao's module_filter_fn)."""
    if not isinstance(module, nn.Linear):
        return False
    if fqn.rsplit(".", 1)[-1] in SKIPPED_FQNS:
        return False
    out_f, in_f = module.weight.shape
    if in_f % MULTIPLE or out_f % MULTIPLE:
        return False
    return not (in_f <= SMALL_IN and out_f <= SMALL_OUT)


def planned(model: nn.Module) -> list[str]:
    """The names of the linear layers the conversion would swap, without converting or running anything."""
    return [fqn for fqn, mod in model.named_modules() if converts(mod, fqn)]


def check_device(device: torch.device) -> None:
    """Refuse float8 where there are no float8 tensor cores (ConfigError: exit 2)."""
    if device.type != "cuda":
        raise ConfigError(f"training.float8 needs a CUDA GPU of compute capability {'.'.join(map(str, MIN_CAPABILITY))} "
                          f"or newer (Ada, Hopper); this process trains on {device.type} "
                          "(set training.float8: false)")  # fmt: skip
    cap = torch.cuda.get_device_capability(device)
    if cap < MIN_CAPABILITY:
        name = torch.cuda.get_device_name(device)
        raise ConfigError(f"training.float8 needs compute capability {'.'.join(map(str, MIN_CAPABILITY))} or newer "
                          f"(Ada, Hopper); {name} is {cap[0]}.{cap[1]} (set training.float8: false)")  # fmt: skip


def apply_float8(model: nn.Module, *, fsdp: bool, name: str = "model") -> list[str]:
    """Swap the selected linears for Float8Linear in place (before tensor parallelism, compile and
    FSDP: parallel/block_compile.py says why); returns their names."""
    try:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training  # noqa: PLC0415 - only with float8 on
    except ImportError as e:  # an image built without the trainer's requirements
        raise ConfigError(f"training.float8 needs torchao, which this image lacks ({e}); install the trainer's "
                          "requirements (pip install 'disttrain[trainer]') or set training.float8: false") from None  # fmt: skip

    names = planned(model)
    if not names:
        raise ConfigError(f"training.float8: model {name!r} has no linear layer float8 would speed up (both dimensions "
                          f"multiples of {MULTIPLE}, more than {SMALL_IN} inputs or {SMALL_OUT} outputs); "
                          "set training.float8: false")  # fmt: skip
    config = Float8LinearConfig(enable_fsdp_float8_all_gather=fsdp)
    convert_to_float8_training(model, module_filter_fn=converts, config=config)
    return names
