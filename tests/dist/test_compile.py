"""training.compile composes with the layouts it has to work under, and trains like eager.

One gloo run of two processes covers the wrappers in compile mode default (one tiny GPT shape
and 8 rows a block call wherever the layout allows: inductor's C++ compile on a CPU takes tens of
seconds the first time, and a later compile of the same graph is a cache hit; the mode
max-autotune-no-cudagraphs is test_compile_trainer.py's, in one process):
  - FSDP2 over both ranks, activation checkpointing of every block, compile mode default;
  - a two-stage 1F1B pipeline (its stages' timing and activation hooks around the compiled
    blocks), compile mode default;
  - tensor parallelism over both ranks with sequence parallelism, compile mode default (the
    blocks; the loss stays eager there, as in the trainer: block_compile.loss_mode);
  - PipeDream's weight stashing (one stage holding every block, on rank 0): each forward runs the
    compiled blocks on a fresh snapshot of the weights (torch.func.functional_call), which the
    graph takes as inputs, so it compiles once and not per version.
Each is compared with the same run in eager mode: the per-step losses agree within LOSS_RTOL
(inductor fuses the kernels, so sums are taken in another order; a wrong gradient shows after a
step or two as a difference of percents), and after the first step nothing compiles again
(CompileClock, torch._dynamo's compile callbacks: no recompilation per step).

The trainer-level figures (compileS, recompiles, steady-state throughput) are in
test_compile_trainer.py; DDP composes there.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from disttrain_trainer.models import GPT
from disttrain_trainer.modes.pipeline.partition import Plan, uniform_bounds
from disttrain_trainer.modes.pipeline.pipedream import PipeDreamStage
from disttrain_trainer.modes.pipeline.schedules import Pipeline
from disttrain_trainer.parallel.block_compile import CompileClock, apply_compile, compile_loss
from disttrain_trainer.parallel.blocks import split_blocks
from disttrain_trainer.parallel.hybrid import apply_layout
from disttrain_trainer.parallel.mesh import Layout, build_mesh
from torch.distributed.tensor.parallel import loss_parallel

VOCAB, SEQ, BATCH, STEPS = 32, 16, 16, 4
LOSS_RTOL = 1e-4


def _gpt(act_ckpt: str = "none") -> GPT:
    torch.manual_seed(0)
    return GPT(vocab=VOCAB, block_size=SEQ, dim=32, layers=2, heads=2, dropout=0.0, act_ckpt=act_ckpt)


def _loss(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), y.reshape(-1))


def _batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(5)
    return [(torch.randint(0, VOCAB, (BATCH, SEQ), generator=gen), torch.randint(0, VOCAB, (BATCH, SEQ), generator=gen))
            for _ in range(STEPS)]  # fmt: skip


def _mesh_losses(layout: Layout, mode: str | None, act_ckpt: str) -> tuple[list[float], int]:
    """Per-step losses of a mesh layout (every rank its data slice), and compilations after step 1."""
    mesh = build_mesh(layout, "cpu")
    model = apply_layout(_gpt(act_ckpt), mesh=mesh, layout=layout, device=torch.device("cpu"), compile_mode=mode)
    loss_fn = compile_loss(_loss, mode if layout.tp == 1 else None)  # as the trainer (block_compile.loss_mode)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    clock = CompileClock()
    losses, later = [], 0
    for step, (x, y) in enumerate(_batches()):
        x, y = x.chunk(layout.dp)[mesh["dp"].get_local_rank()], y.chunk(layout.dp)[mesh["dp"].get_local_rank()]
        opt.zero_grad()
        with loss_parallel():
            loss = loss_fn(model(x), y)
            loss.backward()
        opt.step()
        t = loss.full_tensor() if hasattr(loss, "full_tensor") else loss.detach()
        dist.all_reduce(t)
        losses.append(float(t) / dist.get_world_size())
        if step > 0:
            later += clock.take()[1]
        else:
            clock.take()
    clock.close()
    return losses, later


def _pipeline_losses(mode: str | None) -> tuple[list[float], int]:
    model = _gpt()
    blocks = split_blocks(model)
    bounds = uniform_bounds(len(blocks), 2)
    plan = Plan(method="uniform", bounds=bounds, stage_seconds=(0.0, 0.0))
    rank = dist.get_rank()
    pipe = Pipeline(blocks, plan, schedule="1F1B", microbatches=2, virtual=1, pp_rank=rank, pp_size=2, group=None,
                    device=torch.device("cpu"), loss_fn=compile_loss(_loss, mode))  # fmt: skip
    if mode is not None:
        apply_compile(model, mode)
    opt = torch.optim.AdamW(pipe.parameters(), lr=1e-2)
    clock = CompileClock()
    losses, later = [], 0
    for step, (x, y) in enumerate(_batches()):
        opt.zero_grad()
        out = pipe.step(x, y)
        opt.step()
        t = torch.tensor([float(out.loss) if out.loss is not None else 0.0])
        dist.all_reduce(t)  # the last stage's loss, on every rank
        losses.append(float(t))
        n = clock.take()[1]
        later += n if step > 0 else 0
    clock.close()
    return losses, later


def _pipedream_losses(mode: str | None) -> tuple[list[float], int]:
    model = _gpt()
    stage_mod = torch.nn.Sequential(*split_blocks(model))
    if mode is not None:
        apply_compile(model, mode)
    opt = torch.optim.AdamW(stage_mod.parameters(), lr=1e-2)
    stage = PipeDreamStage(module=stage_mod, stage=0, stages=1, optimizer=opt, loss_fn=compile_loss(_loss, mode),
                           device=torch.device("cpu"))  # fmt: skip
    clock = CompileClock()
    losses, later = [], 0
    for step, (x, y) in enumerate(_batches()):
        out = stage.step(list(x.chunk(2)), list(y.chunk(2)), 2)  # two versions a step
        losses.append(float(out.loss))
        n = clock.take()[1]
        later += n if step > 0 else 0
    clock.close()
    return losses, later


def _fresh() -> None:
    """Forget the compiled graphs of the previous configuration: a trainer process compiles one
    configuration, while here every configuration shares the blocks' and the loss's code (and
    dynamo would turn a shape seen in two configurations dynamic). The compiled code stays in
    inductor's on-disk cache, so this costs tracing, not compiling."""
    torch._dynamo.reset()


def _close(got: list[float], ref: list[float], what: str) -> None:
    for step, (a, b) in enumerate(zip(got, ref, strict=True)):
        assert abs(a - b) <= LOSS_RTOL * abs(b), f"{what}: step {step + 1} loss {a} vs eager {b}"


def _all() -> None:
    fsdp = Layout(dp=2, pp=1, tp=1, data_strategy="fsdp", sequence_parallel=False)
    eager, _ = _mesh_losses(fsdp, None, "every:1")
    _fresh()
    got, later = _mesh_losses(fsdp, "default", "every:1")
    _close(got, eager, "fsdp + activation checkpointing, compile default")
    assert later == 0, f"fsdp: {later} compilations after the first step"

    eager, _ = _pipeline_losses(None)
    _fresh()
    got, later = _pipeline_losses("default")
    _close(got, eager, "1F1B pipeline, compile default")
    assert later == 0, f"pipeline: {later} compilations after the first step"

    if dist.get_rank() == 0:
        eager, _ = _pipedream_losses(None)
        _fresh()
        got, later = _pipedream_losses("default")
        _close(got, eager, "PipeDream weight stashing, compile default")
        assert later == 0, f"PipeDream: {later} compilations after the first step"

    tp = Layout(dp=1, pp=1, tp=2, data_strategy="ddp", sequence_parallel=True)
    eager, _ = _mesh_losses(tp, None, "none")
    _fresh()
    got, later = _mesh_losses(tp, "default", "none")
    _close(got, eager, "tensor parallel + sequence parallel, compile default")
    assert later == 0, f"tensor parallel: {later} compilations after the first step"


def test_compiled_blocks_train_like_eager_under_fsdp_pipelines_and_tensor_parallel(gloo) -> None:  # noqa: ANN001
    gloo(_all, 2)
