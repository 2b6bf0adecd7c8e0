set -u
BUILD_SPECS="moe:0" TIER_FILES=tests/test_moe_cuda_gpu.py TIER_K="graph or official or reshaped" TIER_S=200 TEST_S=180 bash benchmarks/gpu_session.sh build tier > $OUT/a.log 2>&1; grep -E "passed|failed|error|rc=" $OUT/a.log | tail -5
export KBENCH_RESULTS=$OUT/hg; mkdir -p $KBENCH_RESULTS
for r in 1 2; do
  KBENCH_MOE_FULL_KEY=1 timeout 100 python3 benchmarks/host_gap.py moe --runs 30 --label "cuda[full-key]" >> $OUT/hg.log 2>&1; echo "full rc=$?"
  timeout 100 python3 benchmarks/host_gap.py moe --runs 30 >> $OUT/hg.log 2>&1; echo "addr rc=$?"
done
grep -B2 -A8 "issue" $OUT/hg.log | grep -v "^\s*$" | tail -40
timeout 120 kbench perf moe --backend cuda --json $OUT/perf_moe.json > $OUT/perf.log 2>&1; tail -6 $OUT/perf.log
