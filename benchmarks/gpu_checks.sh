#!/usr/bin/env bash
# The checks a machine with one CUDA GPU runs, in one command (about 12 minutes with every phase): the
# gpu-marked tests (the GPT example on NCCL with fp16 and bf16, the pipeline's CUDA-event
# timeline), then benchmarks/gpu_gpt.py (tokens/s, MFU and peak memory, disttrain vs a plain
# loop, 5 rounds a configuration with the sides alternating): the example shape in bf16 eager and
# compiled, then the 1.3B shape compiled, with float8 on top where the GPU has float8 (compute
# capability 8.9+). Each phase has its own time limit (seconds, overridable) and gpu_gpt.py writes
# its JSON after every configuration, so a phase cut short keeps what it measured.
# Logs and JSON go to $OUT (or a temporary folder). Uses the python3 that has a CUDA torch.
#
# Fault tolerance (phase "ft"): the gpu-marked tests of tests/dist/test_ft_gpu.py (torchft's
# Manager over NCCL, one replica: NCCL refuses two ranks on one GPU), then the per-step cost of
# fault-tolerant DP against plain DP on the GPU (benchmarks/fault_tolerance.py correct).
# Where the CUDA image lacks the trainer's requirements, carry their wheels (pip download --no-deps)
# and put them on PYTHONPATH before this script: torchft==0.2.0 with its opentelemetry requirements
# (the ft phase), torchao==0.18.0 (training.float8: the float8 test and benchmark); a test of
# training.float8 without torchao fails with the trainer's ConfigError naming it.
# GPU_PHASES picks the phases, in this order: tests ft bench (default: all three).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-$(mktemp -d)}
export PYTHONPATH="$PWD/operator:$PWD/trainer:$PWD/cli${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
phases=" ${GPU_PHASES:-tests ft bench} "
start=$(date +%s)
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,compute_cap --format=csv | tee "$out/gpu.txt"
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'nccl', torch.cuda.nccl.version())" | tee -a "$out/gpu.txt"
fp8=$(python3 -c "import torch; print(int(torch.cuda.get_device_capability() >= (8, 9)))")

if [[ $phases == *" tests "* ]]; then
  timeout "${GPU_TESTS_TIMEOUT:-150}" python3 -m pytest tests/dist/test_trainer_gpu.py tests/dist/test_pipeline_timeline.py \
    -m gpu -q -s -p no:cacheprovider 2>&1 | tee "$out/pytest-gpu.log"
fi

if [[ $phases == *" ft "* ]]; then
  if python3 -c "import torchft" 2>&1 | tee -a "$out/gpu.txt"; then
    echo "== fault tolerance ($(( $(date +%s) - start )) s in)" | tee "$out/ft.log"
    timeout "${GPU_FT_TESTS_TIMEOUT:-180}" python3 -m pytest tests/dist/test_ft_gpu.py -m gpu -q -s -p no:cacheprovider \
      2>&1 | tee -a "$out/ft.log"
    DISTTRAIN_DEVICE=cuda timeout "${GPU_FT_BENCH_TIMEOUT:-200}" python3 benchmarks/fault_tolerance.py correct \
      --model gpt --gpt 256x4 --gpt-batch 16 --replicas 1 --steps 300 --rounds 3 --json "$out/ft-correct.json" \
      2>&1 | tee -a "$out/ft.log"
  else
    echo "torchft is not importable: the ft phase did not run (see the header)" | tee -a "$out/ft.log"
  fi
fi

bench() {  # NAME TIMEOUT ARGS...
  local name=$1 limit=$2
  shift 2
  echo "== gpu_gpt $name ($(( $(date +%s) - start )) s in)" | tee -a "$out/gpu_gpt.log"
  timeout "$limit" python3 benchmarks/gpu_gpt.py --rounds 5 --json "$out/gpu_gpt-$name.json" "$@" 2>&1 | tee -a "$out/gpu_gpt.log"
}
if [[ $phases == *" bench "* ]]; then
  bench example-eager "${GPU_BENCH_EAGER_TIMEOUT:-75}" --shapes example --precisions bf16
  bench example-compile "${GPU_BENCH_COMPILE_TIMEOUT:-95}" --shapes example --precisions bf16 --compile default
  if [ "$fp8" = 1 ]; then
    bench 1.3b-compile-float8 "${GPU_BENCH_FLOAT8_TIMEOUT:-75}" --shapes 1.3b --precisions bf16 --compile default --float8
  fi
  bench 1.3b-compile "${GPU_BENCH_BIG_TIMEOUT:-80}" --shapes 1.3b --precisions bf16 --compile default
fi
echo "gpu_checks.sh: $(( $(date +%s) - start )) s; results in $out" | tee -a "$out/gpu_gpt.log"
