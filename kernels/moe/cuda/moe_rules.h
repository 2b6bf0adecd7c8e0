// The parts of MoeConfig (moe_api.h) that depend on the call's shape, in plain C++ (no CUDA; CPU-tested by
// tests/test_knobs.py): moe.cu's moe_config asks these.
#pragma once
#include "knobs.h"

// skip_empty_halves (a consumer warpgroup whose 64 rows all lie past its group's end issues no MMAs): forced by
// KBENCH_MOE_SKIP_EMPTY_HALVES=0/1; unset, on where a routed expert averages <= 512 rows (the 2048-token case: its
// groups end 1-23 rows into a third m-tile, 20% of the units). There those units run at the pace of their loads
// either way, so they keep their neighbours' step, and the MMAs skipped raise the clock (-1.1% / -1.8% of GEMM 1 /
// 2, official -0.25% at 2048, twenty-sixth session). With larger groups the few half-empty units end early and fall
// out of the step (+3% at 8192 tokens; docs/moe-notes.md).
inline bool moe_skip_empty_halves(int T, int K, int E) {
  const int forced = kb::env_int("KBENCH_MOE_SKIP_EMPTY_HALVES", -1);
  return forced < 0 ? static_cast<long long>(T) * K <= 512LL * E : forced != 0;
}
