#!/usr/bin/env bash
# One device-machine session: install kbench in place, run the GPU test tier, judge every single-GPU problem with
# `kbench test`, then time them with `kbench perf` (official protocol) and the fp8-mm kernel benchmark.
# Usage: bash benchmarks/gpu_session.sh [tests|perf|verify|fp8-check|fp8-perf|dist] ; logs go to $OUT (or ./gpu-out).
set -uo pipefail
export PYTHONUNBUFFERED=1 COLUMNS=150
OUT=${OUT:-$PWD/gpu-out}; mkdir -p "$OUT"
part=${1:-tests}
python3 -m pip install --no-build-isolation --no-deps -q -e . >"$OUT/pip.log" 2>&1 || cat "$OUT/pip.log"
if ! command -v kbench >/dev/null; then  # no console script: a wrapper with the same name
  mkdir -p /tmp/kbench-bin; printf '#!/bin/sh\nexec python3 %s/cli.py "$@"\n' "$PWD" >/tmp/kbench-bin/kbench
  chmod +x /tmp/kbench-bin/kbench; export PATH=/tmp/kbench-bin:$PATH
fi
nvidia-smi -L; python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
stamp() { echo "== $(date +%T) $*"; }

case "$part" in
tests)
  stamp "GPU test tier"
  timeout 420 python3 -m pytest -m gpu -s -q -rs -p no:cacheprovider --durations=25 tests 2>&1 | tee "$OUT/pytest_gpu.log" | tail -60
  for p in fp8-mm moe mla-decode; do
    stamp "kbench test $p"
    start=$(date +%s%N)
    timeout 300 kbench test "$p" --json "$OUT/test_$p.json" 2>&1 | tail -25
    echo "kbench test $p: wall $(( ($(date +%s%N) - start) / 1000000 )) ms"
  done ;;
perf)
  stamp "GPU tests fixed since the last session"
  timeout 120 python3 -m pytest -m gpu -q -rs -p no:cacheprovider tests/test_evaluator.py tests/test_cli.py 2>&1 | tail -8
  stamp "kbench device"; timeout 120 kbench device 2>&1 | tail -15
  for b in torch triton cuda; do
    stamp "kbench perf fp8-mm --backend $b"
    timeout 150 kbench perf fp8-mm --backend "$b" --json "$OUT/perf_fp8-mm_$b.json" 2>&1 | tail -28
  done
  for p in moe mla-decode; do
    stamp "kbench perf $p"; timeout 150 kbench perf "$p" --json "$OUT/perf_$p.json" 2>&1 | tail -12
  done
  stamp "kbench perf fp8-mm --backend cuda --mode leaderboard"
  timeout 150 kbench perf fp8-mm --backend cuda --mode leaderboard --json "$OUT/lb_fp8-mm_cuda.json" 2>&1 | tail -6
  stamp "benchmarks/fp8_mm.py"; timeout 240 python3 benchmarks/fp8_mm.py --no-sweep 2>&1 | tail -40 ;;
verify)
  stamp "GPU test tier (full log in pytest_gpu.log)"
  timeout 300 python3 -m pytest -m gpu -q -rs -p no:cacheprovider --durations=10 tests >"$OUT/pytest_gpu.log" 2>&1
  tail -30 "$OUT/pytest_gpu.log"
  stamp "moe torch paths"; timeout 120 python3 benchmarks/moe_torch.py 2>&1 | tail -25
  for b in cuda triton; do
    stamp "kbench test fp8-mm --backend $b"; timeout 120 kbench test fp8-mm --backend "$b" 2>&1 | tail -2
  done
  stamp "kbench profile fp8-mm --backend cuda (one case)"
  timeout 120 kbench profile fp8-mm --backend cuda --case "m: 1024; n: 1536; k: 7168; seed: 8135" 2>&1 | tail -14
  stamp "kbench perf fp8-mm --backend cuda"
  timeout 120 kbench perf fp8-mm --backend cuda --json "$OUT/perf_fp8-mm_cuda.json" 2>&1 | tail -3
  stamp "benchmarks/fp8_mm.py"; timeout 200 python3 benchmarks/fp8_mm.py --no-sweep 2>&1 | tail -24 ;;
fp8-check)
  stamp "fp8-mm quick check, then under compute-sanitizer memcheck"
  timeout 150 python3 benchmarks/fp8_mm.py --quick >"$OUT/fp8_quick.log" 2>&1; echo "rc=$?"; tail -3 "$OUT/fp8_quick.log"
  timeout 240 compute-sanitizer --tool memcheck python3 benchmarks/fp8_mm.py --quick >"$OUT/fp8_memcheck.log" 2>&1
  echo "rc=$?"; tail -4 "$OUT/fp8_memcheck.log"
  stamp "GPU tests of the fp8-mm CUDA backend"
  timeout 150 python3 -m pytest -q -rs -p no:cacheprovider tests/test_fp8_cuda_plans_gpu.py \
    tests/test_fp8_backends_gpu.py -k "not triton" 2>&1 | tail -8 ;;
fp8-perf)
  stamp "benchmarks/fp8_mm.py (no sweep, no triton)"
  timeout 330 python3 benchmarks/fp8_mm.py --no-sweep --no-triton >"$OUT/fp8_bench.log" 2>&1; echo "rc=$?"
  grep -E "correctness|failures" "$OUT/fp8_bench.log" | tail -3; tail -48 "$OUT/fp8_bench.log"
  stamp "kbench perf fp8-mm --backend cuda"
  timeout 150 kbench perf fp8-mm --backend cuda --json "$OUT/perf_fp8-mm_cuda.json" 2>&1 | tail -24 ;;
dist)
  export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
  n=$(nvidia-smi -L | wc -l)
  stamp "GPU tests of the distributed problems, the evaluator and the CLI"
  timeout 120 python3 -m pytest -m "gpu" -q -rs -p no:cacheprovider tests/test_problems_distributed.py \
    tests/test_torch_backends.py tests/test_evaluator.py tests/test_cli.py tests/test_generator.py -k "not official_tests" >"$OUT/pytest_gpu.log" 2>&1
  tail -15 "$OUT/pytest_gpu.log"
  for p in all2all gemm-rs ag-gemm; do
    stamp "kbench test $p --world-size $n"
    timeout 70 kbench test "$p" --world-size "$n" 2>&1 | tail -16
    stamp "kbench perf $p --world-size $n"
    timeout 70 kbench perf "$p" --world-size "$n" --json "$OUT/perf_$p.json" 2>&1 | tail -14
  done ;;
esac
stamp done
