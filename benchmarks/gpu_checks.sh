#!/usr/bin/env bash
# The checks a machine with one CUDA GPU runs: the gpu-marked tests (the GPT example on NCCL
# with fp16 and bf16), then benchmarks/gpu_gpt.py (tokens/s and MFU, disttrain vs a plain loop).
# Logs go to $OUT (or a temporary folder). Uses the python3 that has a CUDA torch.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-$(mktemp -d)}
export PYTHONPATH="$PWD/operator:$PWD/trainer" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv | tee "$out/gpu.txt"
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'nccl', torch.cuda.nccl.version())" | tee -a "$out/gpu.txt"
timeout "${GPU_TESTS_TIMEOUT:-240}" python3 -m pytest tests/dist/test_trainer_gpu.py -m gpu -q -s -p no:cacheprovider 2>&1 | tee "$out/pytest-gpu.log"
timeout "${GPU_BENCH_TIMEOUT:-330}" python3 benchmarks/gpu_gpt.py --json "$out/gpu_gpt.json" 2>&1 | tee "$out/gpu_gpt.log"
