#!/usr/bin/env bash
# One device-machine session: install kbench in place, then run the named parts (several in one call).
#   bash benchmarks/gpu_session.sh PART [PART...]      logs and results under $OUT (or ./gpu-out)
# Parts (one GPU): build (compile the CUDA backends in parallel first: saves minutes on a fresh machine; BUILD_SPECS
#   = "problem:dev ..." picks which), probe, wgmma-energy (benchmarks/wgmma_energy_probe.py PROBE_ARGS, then its SASS's
#   HGMMA forms),
#   fp8-check, fp8-perf, moe-check, moe-perf, mla-check, mla-perf (checks, then the benchmark scripts with their
#   candidates, then kbench perf; moe-bench, mla-bench: only the benchmark script, BENCH_CANDIDATES = which, BENCH_REV = a git revision timed beside; mla-dev-costs: the attention as shipped, without its RoPE and with its ring's loads alone, a dev build: BUILD_SPECS mla-decode:1; mla-trace: the attention's per-phase clock64 trace, the same dev build; moe-trace: every GEMM unit's stamps, official and back to back (a dev build: BUILD_SPECS moe:1); mla-projections: each projection GEMM alone, cuBLAS against linear.cuh; mla-scaling: the attention alone over cache lengths and batches, BENCH_CANDIDATES beside it; mla-scaling-clean: the same
#   with the L2 flushed by reading; mla-head-gemm: the per-head GEMMs alone, head_gemm.cuh against cuBLAS), tier (the GPU test tier), profile (kbench profile of moe and mla-decode cuda),
#   timeline (benchmarks/calls.py --timeline for TIMELINE_PROBLEMS: each kernel of the steady state's call, its start,
#   length and the idle before it, medians of TIMELINE_CALLS calls; TIMELINE_BACKEND; TIMELINE_LABEL: the rows' name),
#   sanitize (compute-sanitizer on small cases of the CUDA backends), ncu (Nsight Compute's sections for the kernels
#   matching NCU_KERNELS in benchmarks/calls.py NCU_PROBLEM: NCU_SKIP launches skipped, NCU_COUNT profiled), moe-official, mla-official (kbench perf of the
#   shipped build and of each candidate, in the modes OFFICIAL_MODES, default benchmark; OFFICIAL_CANDIDATES = which
#   candidates, comma-separated, default all); host-gap (benchmarks/host_gap.py for GAP_PROBLEMS: the official
#   window with CUDA events inside it; GAP_LEADERBOARD=1: inputs regenerated and checked every run, as leaderboard mode
#   does; GAP_ADDRESSES=1: which inputs move between runs, and the graphs the binding launched; GAP_LABEL: the rows'
#   backend name, for a run with a knob set); energy (benchmarks/energy.py ENERGY_ARGS, default moe: J a call, SM clock);
#   mla-absorb (the q path alone: q_up, q_up then the W_UK GEMM, q_up absorbing W_UK; BENCH_RUNS);
#   mla-energy (the attention kernel alone: J a call, SM clock, power cap; ENERGY_ROUNDS, BENCH_CANDIDATES);
#   mla-windows (official-style host windows in one process, BENCH_CANDIDATES alternating with the shipped path in
#   WINDOW_ROUNDS rounds, BENCH_RUNS calls each; WINDOW_LEADERBOARD=1: inputs regenerated and checked every window);
#   moe-peer (benchmarks/moe.py with FlashInfer's fused MoE: the wheels in PEER_WHEELS, default .whl, and the module
#   benchmarks/flashinfer_moe_build.py made, PEER_MODULE, default .whl/fused_moe_90.tgz; carry .whl);
#   moe-phases (benchmarks/moe_launch_phases.py: custom_kernel's host steps before
#   and around its graph launch, PHASES_CANDIDATES beside the shipped path, PHASES_RUNS calls, PHASES_S seconds,
#   PHASES_PIECES > 0: each host step alone that many times; PHASES_NO_CLONE=1: a no-clone arm beside them);
#   import-probe (kbench test of PROBE_PROBLEM's cuda backend twice, then each kbench build folder's times, ninja log
#   and `ninja -n -d explain`: why an unchanged submission's import rebuilds on the device machine);
#   gc-ab (GC_PROBLEMS' generated GC_BACKEND submission, default torch, judged by kbench perf with and without Python's
#   cyclic garbage collector, alternating, GC_ROUNDS rounds: records/gc_P[_nogc]_R.json);
#   perf (kbench perf of each PERF_SPECS entry "problem:backend[:mode[:NAME=VALUE]]", run with that variable set, in
#   the order given; its record in records/perf_P_B_M[_NAME=VALUE]_I.json, I its place in the list, for `collect.py
#   record`);
# Limits: TIER_S, PROFILE_S, SANITIZE_S seconds; PROFILE_PROBLEMS = which problems `profile` runs; TIER_FILES = the test files of the tier, in the order given;
#   TIER_K = a pytest -k expression selecting among them; SANITIZE_TOOL = compute-sanitizer's tool (memcheck,
#   racecheck, synccheck), SANITIZE_K = the tests it runs (a pytest -k expression; it matches
#   parameter ids too, without case: 'head_gemm' also selects test_every_official_case[LINEAR=0,HEAD_GEMM=0]).
# several GPUs: dist-check (DIST_CHECK_K: pytest -k), dist-bench (benchmarks/distributed.py for DIST_PROBLEMS, each with its DIST_CANDIDATES;
#   DIST_WINDOW=1: also the official multi-rank window, --window; DIST_TRACE=1: all2all's phases, --trace),
#   dist-probe (ag-gemm's overlapped path in pieces: distributed.py --probe), dist-perf (kbench perf of DIST_PROBLEMS
#   for each of DIST_BACKENDS, default cuda: one build read 795.7 and 444.7 us official on two pairs, so compare a
#   backend with torch only on the same pair; in each of DIST_MODES, default benchmark),
#   dist-tier, window-ab
#   (all2all's torch backend judged, alternately, by kbench as it was at the revision in OLD_KBENCH, a `git archive`
#   tarball, and by kbench now: the multi-rank window before and after it matched the official harness).
# Everything lands in one archive, $OUT/session.tgz (logs/, records/, results/<problem>.csv from KBENCH_RESULTS; a
# later invocation in the same $OUT: session.2.tgz, ...):
# unpack it and merge the rows with
#   python -c "from kbench import benchlib; benchlib.merge('<unpacked>/results', 'benchmarks/results')".
set -uo pipefail
export PYTHONUNBUFFERED=1 COLUMNS=160 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-$PWD/gpu-out}; mkdir -p "$OUT"
W=$(mktemp -d); mkdir -p "$W/logs" "$W/results" "$W/records"
# a second invocation in one device call packs into session.2.tgz, ... (one once replaced the first's archive: its
# logs and rows were lost)
pack() { local f="$OUT/session.tgz" n=2; while [ -e "$f" ]; do f="$OUT/session.$n.tgz"; n=$((n + 1)); done
         tar czf "$f" -C "$W" logs results records; }
trap pack EXIT
export KBENCH_RESULTS="$W/results" KBENCH_CACHE="$W/cache"
python3 -m pip install --no-build-isolation --no-deps -q -e . >"$W/logs/pip.log" 2>&1 || cat "$W/logs/pip.log"
stamp() { echo "== $(date +%T) $*"; }
step() {  # step SECONDS LOGNAME command...: run, keep the whole log, print its tail
  local limit=$1 log=$2; shift 2
  stamp "$*"
  # a step killed at its limit can leave torch's extension build lock behind; every later load of that extension
  # would wait on it forever (steps run one at a time, so no lock is live here)
  find "${TORCH_EXTENSIONS_DIR:-$HOME/.cache/torch_extensions}" -name lock -delete 2>/dev/null
  timeout "$limit" "$@" >"$W/logs/$log.log" 2>&1; local rc=$?
  tail -n "${TAIL:-25}" "$W/logs/$log.log"; echo "-- rc=$rc ($log)"
}
nvidia-smi -L; python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
n=$(nvidia-smi -L | wc -l)
for part in "$@"; do
  case "$part" in
  build) stamp "build: the single-GPU CUDA backends, in parallel, into the extension cache the tests reuse"
         for spec in ${BUILD_SPECS:-fp8-mm:0 moe:0 moe:1 mla-decode:0}; do
           python3 -c "from kbench import benchlib; benchlib.build('${spec%%:*}', 'cuda', dev=bool(${spec##*:}))" \
             >"$W/logs/build_${spec/:/_}.log" 2>&1 &
         done
         wait; grep -l -i "error" "$W"/logs/build_*.log || echo "-- builds done" ;;
  probe) step 300 probe python3 benchmarks/wgmma_layout_probe.py ;;
  wgmma-energy) step 300 wgmma_energy python3 benchmarks/wgmma_energy_probe.py --record ${PROBE_ARGS:-}
                so=$(find "${TORCH_EXTENSIONS_DIR:-$HOME/.cache/torch_extensions}" -name 'kbench_wgmma_energy_probe*.so' | head -1)
                [ -n "$so" ] && cuobjdump -sass "$so" | grep -o 'HGMMA\.[0-9A-Za-z.]*' | sort | uniq -c ;;
  fp8-check) step 400 fp8_check python3 -m pytest -q -x -p no:cacheprovider tests/test_fp8_cuda_plans_gpu.py tests/test_fp8_backends_gpu.py -k "not triton" ;;
  fp8-perf) step 500 fp8_bench python3 benchmarks/fp8_mm.py --no-triton
            step 200 fp8_perf kbench perf fp8-mm --backend cuda --json "$W/records/perf_fp8-mm_cuda.json" ;;
  perf) i=0
        for spec in ${PERF_SPECS:?PERF_SPECS lists problem:backend[:mode[:NAME=VALUE]] entries}; do
          IFS=: read -r p b m e <<<"$spec"; m=${m:-benchmark}; i=$((i + 1)); name="perf_${p}_${b}_$m${e:+_$e}_$i"
          step "${PERF_S:-300}" "$name" env ${e:+"$e"} kbench perf "$p" --backend "$b" --mode "$m" \
            --json "$W/records/$name.json"
        done ;;
  gc-ab) for p in ${GC_PROBLEMS:-gemm-rs}; do  # is Python's cyclic GC what makes the official windows' rare slow runs?
           ws=$(python3 -c "from kbench import problems; print('--world-size $n' if problems.load_spec('$p').world_size else '')" 2>/dev/null)
           kbench gen "$p" --backend "${GC_BACKEND:-torch}" -o "$W/sub_$p.py" >/dev/null
           { echo "import gc; gc.disable()  # gc-ab: the collector off in every rank"; cat "$W/sub_$p.py"; } >"$W/sub_${p}_nogc.py"
           for r in $(seq "${GC_ROUNDS:-2}"); do
             for v in "" _nogc; do
               step 200 "gc_${p}${v}_$r" kbench perf "$p" --submission "$W/sub_$p$v.py" $ws --json "$W/records/gc_${p}${v}_$r.json"
             done
           done
         done ;;
  import-probe) for i in 1 2; do  # why a GPU run's import rebuilds an unchanged submission (docs/distributed-notes.md)
                  step 300 "import_probe_$i" kbench test "${PROBE_PROBLEM:-fp8-mm}" --backend cuda \
                    --case "${PROBE_CASE:-m: 64; n: 128; k: 256; seed: 1}"
                done
                root=$(python3 -c "import torch.utils.cpp_extension as c; print(c.get_default_build_root())")
                for d in "$root"/*/kbench_*; do  # what ninja would redo now, and why
                  { echo "== $d"; ls -la --time-style=+%T.%N "$d"; tail -n 8 "$d/.ninja_log"; ninja -C "$d" -n -d explain; } \
                    >>"$W/logs/import_probe_ninja.log" 2>&1
                done
                tail -n 40 "$W/logs/import_probe_ninja.log" ;;
  moe-check) step "${CHECK_S:-500}" moe_check python3 -m pytest -q -x -p no:cacheprovider ${MOE_CHECK_K:+-k "$MOE_CHECK_K"} \
               tests/test_moe_cuda_gpu.py ;;  # MOE_CHECK_K: a -k expression (one candidate's tests)
  moe-perf) step 400 moe_bench python3 benchmarks/moe.py
            step 300 moe_perf kbench perf moe --backend cuda --json "$W/records/perf_moe_cuda.json"
            step 400 moe_lb kbench perf moe --backend cuda --mode leaderboard --json "$W/records/lb_moe_cuda.json" ;;
  moe-official) step "${OFFICIAL_S:-300}" moe_official python3 benchmarks/moe.py --official "${OFFICIAL_MODES:-benchmark}" \
                  --rounds "${OFFICIAL_ROUNDS:-1}" \
                  ${OFFICIAL_CANDIDATES+--candidates "$OFFICIAL_CANDIDATES"} ;;
  mla-official) step "${OFFICIAL_S:-300}" mla_official python3 benchmarks/mla_decode.py --official "${OFFICIAL_MODES:-benchmark}" \
                  --rounds "${OFFICIAL_ROUNDS:-1}" \
                  ${OFFICIAL_CANDIDATES+--candidates "$OFFICIAL_CANDIDATES"} ;;
  moe-bench) step "${BENCH_S:-400}" moe_bench python3 benchmarks/moe.py --runs "${BENCH_RUNS:-15}" \
               ${BENCH_CANDIDATES+--candidates "$BENCH_CANDIDATES"} ${BENCH_REV:+--rev "$BENCH_REV"} ;;
  moe-peer) fi="$W/fisite"  # FlashInfer's fused MoE beside the cuda backend (moe.py's flashinfer column)
            if [ ! -f "${PEER_MODULE:-.whl/fused_moe_90.tgz}" ]; then
              echo "moe-peer: no ${PEER_MODULE:-.whl/fused_moe_90.tgz}: run benchmarks/flashinfer_moe_build.py first and carry .whl"
              continue
            fi
            python3 -m pip install -q --no-deps --target "$fi" "${PEER_WHEELS:-.whl}"/*.whl >"$W/logs/peer_pip.log" 2>&1
            mkdir -p "$fi/flashinfer/data/aot/fused_moe_90"
            tar xzf "${PEER_MODULE:-.whl/fused_moe_90.tgz}" -C "$fi/flashinfer/data/aot/fused_moe_90"
            nvlibs=$(python3 -c 'import glob, site; print(":".join(glob.glob(site.getsitepackages()[0] + "/nvidia/*/lib")))')
            step "${BENCH_S:-400}" moe_peer env PYTHONPATH="$fi" FLASHINFER_WORKSPACE_BASE="$W/fiws" \
              LD_LIBRARY_PATH="$nvlibs:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
              python3 benchmarks/moe.py --runs "${BENCH_RUNS:-15}" --candidates "${BENCH_CANDIDATES:-}" ;;
  mla-absorb) step "${BENCH_S:-150}" mla_absorb python3 benchmarks/mla_decode.py --absorb --runs "${BENCH_RUNS:-20}" ;;
  mla-windows) step "${BENCH_S:-300}" mla_windows python3 benchmarks/mla_decode.py --windows --runs "${BENCH_RUNS:-150}" \
                 --rounds "${WINDOW_ROUNDS:-6}" --candidates "${BENCH_CANDIDATES:-}" ${WINDOW_LEADERBOARD:+--leaderboard} ;;
  mla-bench) step "${BENCH_S:-400}" mla_bench python3 benchmarks/mla_decode.py \
               ${BENCH_CANDIDATES+--candidates "$BENCH_CANDIDATES"} ${BENCH_REV:+--rev "$BENCH_REV"} ;;
  moe-phases) step "${PHASES_S:-200}" moe_phases python3 benchmarks/moe_launch_phases.py --runs "${PHASES_RUNS:-30}" \
                --candidates "${PHASES_CANDIDATES:-}" --pieces "${PHASES_PIECES:-0}" ${PHASES_NO_CLONE:+--no-clone} ;;
  # (GAP_HOST_TRACE=N: N more runs under the profiler, the host's calls and the kernels, the last window's timeline;
  # GAP_NO_CLONE=1: the inputs not cloned between windows)
  host-gap) for p in ${GAP_PROBLEMS:-mla-decode moe}; do  # the official window with CUDA events inside it
              step "${GAP_S:-300}" "host_gap_$p" python3 benchmarks/host_gap.py "$p" --runs "${GAP_RUNS:-40}" --profile "${GAP_PROFILE:-0}" ${GAP_CPROFILE:+--cprofile} ${GAP_HOST_TRACE:+--host-trace "$GAP_HOST_TRACE"} ${GAP_LABEL:+--label "$GAP_LABEL"} \
                ${GAP_NO_CLONE:+--no-clone} ${GAP_LEADERBOARD:+--leaderboard --check-each} ${GAP_ADDRESSES:+--addresses}
            done ;;
  energy) step "${ENERGY_S:-300}" energy python3 benchmarks/energy.py ${ENERGY_ARGS:-moe} ;;  # J a call (NVML)
  mla-energy) step "${ENERGY_S:-300}" mla_energy python3 benchmarks/mla_decode.py --energy \
                --rounds "${ENERGY_ROUNDS:-2}" --candidates "${BENCH_CANDIDATES:-}" ;;  # the attention alone
  mla-dev-costs) step "${BENCH_S:-300}" mla_dev_costs python3 benchmarks/mla_decode.py --dev-costs ;;
  mla-scaling) step "${BENCH_S:-300}" mla_scaling python3 benchmarks/mla_decode.py --scaling --runs "${BENCH_RUNS:-10}" \
                 --candidates "${BENCH_CANDIDATES:-}" ;;
  mla-scaling-clean) step "${BENCH_S:-300}" mla_scaling_clean python3 benchmarks/mla_decode.py --scaling --clean-l2 \
                       --runs "${BENCH_RUNS:-10}" --candidates "${BENCH_CANDIDATES:-}" ;;
  mla-projections) step "${BENCH_S:-300}" mla_projections python3 benchmarks/mla_decode.py --projections ;;
  mla-head-gemm) step "${BENCH_S:-300}" mla_head_gemm python3 benchmarks/mla_decode.py --head-gemm ;;
  moe-trace) TAIL=40 step "${BENCH_S:-400}" moe_trace python3 benchmarks/moe.py --trace --runs "${BENCH_RUNS:-5}" \
                   --candidates "${BENCH_CANDIDATES:-}" ;;
  mla-trace) TAIL=40 step "${BENCH_S:-300}" mla_trace python3 benchmarks/mla_decode.py --phase-trace --trace-out "$W/records/mla_trace" ;;
  mla-check) step 500 mla_check python3 -m pytest -q -x -p no:cacheprovider tests/test_mla_cuda_gpu.py ;;
  mla-perf) step 400 mla_bench python3 benchmarks/mla_decode.py
            step 300 mla_perf kbench perf mla-decode --backend cuda --json "$W/records/perf_mla-decode_cuda.json"
            step 400 mla_lb kbench perf mla-decode --backend cuda --mode leaderboard --json "$W/records/lb_mla-decode_cuda.json" ;;
  tier) step "${TIER_S:-600}" tier python3 -m pytest -m gpu -q -rs --durations=15 -p no:cacheprovider \
          --timeout "${TEST_S:-240}" ${TIER_K:+-k "$TIER_K"} ${TIER_FILES:-tests} ;;
  profile) for p in ${PROFILE_PROBLEMS:-moe mla-decode}; do  # the torch profiler's top kernels of one call a case
             step "${PROFILE_S:-120}" "profile_$p" kbench profile "$p" --backend cuda
           done ;;
  timeline) for p in ${TIMELINE_PROBLEMS:-moe mla-decode}; do  # the steady state's kernels under the profiler
              TAIL=60 step "${PROFILE_S:-300}" "timeline_$p" python3 benchmarks/calls.py "$p" --timeline --record \
                --calls "${TIMELINE_CALLS:-10}" --backend "${TIMELINE_BACKEND:-cuda}" ${TIMELINE_LABEL:+--label "$TIMELINE_LABEL"}
            done ;;
  sanitize) step "${SANITIZE_S:-400}" sanitize compute-sanitizer --tool "${SANITIZE_TOOL:-memcheck}" python3 -m pytest -q -x \
              -p no:cacheprovider tests/test_moe_cuda_gpu.py tests/test_mla_cuda_gpu.py \
              -k "${SANITIZE_K:-synthetic and 7-8 or definition and 3-65 or fused and 1-0}" ;;
  ncu) step "${NCU_S:-400}" ncu ncu --kernel-name "regex:${NCU_KERNELS:-grouped_gemm}" --launch-skip "${NCU_SKIP:-2}" \
         --launch-count "${NCU_COUNT:-6}" --section SpeedOfLight --section ComputeWorkloadAnalysis \
         --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats \
         python3 benchmarks/calls.py "${NCU_PROBLEM:-moe}" --calls 2 ;;
  dist-check) step "${CHECK_S:-500}" dist_check python3 -m pytest -q -x -p no:cacheprovider ${DIST_CHECK_K:+-k "$DIST_CHECK_K"} \
                tests/test_dist_cuda_gpu.py ;;
  dist-bench) for p in ${DIST_PROBLEMS:-all2all gemm-rs ag-gemm}; do  # DIST_CANDIDATES="ag-gemm:a,b gemm-rs:c"
               c=""; for pc in ${DIST_CANDIDATES:-}; do [ "${pc%%:*}" = "$p" ] && c="${pc#*:}"; done
               step "${BENCH_S:-150}" "bench_$p" torchrun --nproc-per-node "$n" benchmarks/distributed.py "$p" \
                 --runs "${RUNS:-20}" --candidates "$c" ${DIST_WINDOW:+--window} ${DIST_TRACE:+--trace}
             done ;;
  dist-probe) step "${BENCH_S:-150}" dist_probe torchrun --nproc-per-node "$n" benchmarks/distributed.py ag-gemm --probe \
                --runs "${RUNS:-15}" ;;
  dist-perf) for p in ${DIST_PROBLEMS:-all2all gemm-rs ag-gemm}; do  # DIST_BACKENDS="cuda torch": both, same pair
               for b in ${DIST_BACKENDS:-cuda}; do
                 for m in ${DIST_MODES:-benchmark}; do  # DIST_MODES="benchmark leaderboard"
                   step 200 "perf_${p}_${b}_$m" kbench perf "$p" --backend "$b" --world-size "$n" --mode "$m" \
                     --json "$W/records/perf_${p}_${b}_$m.json"
                 done
               done
             done ;;
  window-ab) old=$(mktemp -d); tar xf "${OLD_KBENCH:?OLD_KBENCH names a git archive tarball}" -C "$old"
             for i in 1 2; do  # the old tree's kbench is top-level modules run from its own folder
               step 200 "window_old_$i" env -C "$old" PYTHONPATH="$old" python3 -c \
                 "import sys; from cli import main; sys.argv[0] = 'kbench'; main()" perf all2all --backend torch \
                 --world-size "$n" --json "$W/records/window_old_$i.json"
               step 200 "window_new_$i" kbench perf all2all --backend torch --world-size "$n" \
                 --json "$W/records/window_new_$i.json"
             done ;;
  dist-tier) step "${DIST_TIER_S:-600}" dist_tier python3 -m pytest -m gpu -q -rs -p no:cacheprovider tests/test_problems_distributed.py \
               tests/test_torch_backends.py tests/test_evaluator.py tests/test_cli.py ;;
  *) echo "unknown part $part" ;;
  esac
done
stamp done
