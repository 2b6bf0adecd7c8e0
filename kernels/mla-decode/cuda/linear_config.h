// The projection GEMM's named configuration (linear.cuh) and how a shape picks it. Plain C++ (no CUDA): binding.cpp,
// mla.cu and a CPU test (tests/test_knobs.py) include it.
//
// Y [m][n] = X [m][k] W [n][k]^T with m <= 128 (the decode step's batch rows) streams W once; the time is W's bytes
// over the SMs that stream them. One CTA per (n-tile, k-split), one wave: the splits of an n-tile form a thread-block
// cluster and sum their fp32 partials through distributed shared memory, so no partial reaches global memory.
#pragma once
#include <cstdio>

#include "knobs.h"

namespace mla {
constexpr int kLinearBK = 64;                                 // k per stage: one 128-byte swizzle span of bf16
constexpr int kLinearBns[] = {256, 224, 192, 128, 112, 96, 64, 56};  // n-tile widths with a kernel instance (wgmma n)
constexpr int kLinearSplits[] = {1, 2, 4, 8};                 // cluster sizes (8: the portable maximum)
constexpr int kLinearMinKBlocks = 4;                          // k-blocks per split, so the ring has work to overlap
}  // namespace mla

// KBENCH_PRINT_CONFIG=1 prints the one picked for each shape.
struct LinearConfig {
  int bn;      // W rows (Y columns) per CTA; 0: cuBLAS instead (no configuration fits, or KBENCH_MLA_LINEAR=0)
  int splits;  // CTAs per n-tile, each over k / splits (a cluster of that size)
  bool pdl;    // launched with programmatic stream serialization: W's first stages load during the previous kernel
};

// Each configuration's CTAs run in one wave, each streaming bn x k / splits elements of W; the pick maximizes
// n x k / (sms x bn x k / splits), the share of the ideal per-SM stream, and prefers fewer splits, then wider tiles,
// unless more splits are better by over 1%.
// capacity(bn, splits) is how many CTAs of that configuration the GPU holds at once (whole clusters), so a split
// that cannot be co-resident is never chosen. KBENCH_MLA_LINEAR=0 keeps cuBLAS; KBENCH_MLA_LINEAR_BN /
// KBENCH_MLA_LINEAR_SPLITS force a tile and split (when the shape allows them); KBENCH_MLA_LINEAR_PDL=0 launches
// without the early W loads.
template <class Capacity>
inline LinearConfig linear_config(int n, int k, int sms, Capacity&& capacity) {
  LinearConfig best{0, 0, kb::env_int("KBENCH_MLA_LINEAR_PDL", 1) != 0};
  if (kb::env_int("KBENCH_MLA_LINEAR", 1) == 0) return best;
  if (n <= 0 || k <= 0 || k % mla::kLinearBK) return best;
  const int kblocks = k / mla::kLinearBK;
  const int force_bn = kb::env_int("KBENCH_MLA_LINEAR_BN", 0), force_splits = kb::env_int("KBENCH_MLA_LINEAR_SPLITS", 0);
  double best_eff = 0;
  for (const int splits : mla::kLinearSplits) {  // fewer splits first: a split costs a cluster-wide reduction
    if (force_splits && splits != force_splits) continue;
    for (const int bn : mla::kLinearBns) {
      if (force_bn && bn != force_bn) continue;
      if (kblocks % splits || kblocks / splits < mla::kLinearMinKBlocks) continue;
      const int ctas = (n + bn - 1) / bn * splits;
      if (ctas > capacity(bn, splits)) continue;
      const double eff = static_cast<double>(n) * splits / (static_cast<double>(sms) * bn);
      if (eff > best_eff * (splits > best.splits && best.splits ? 1.01 : 1.0001)) {  // earlier wins ties
        best_eff = eff;
        best.bn = bn;
        best.splits = splits;
      }
    }
  }
  return best;
}

inline void linear_describe(const LinearConfig& c, char* buf, int size) {
  snprintf(buf, size, "LinearConfig{bn=%d, splits=%d, pdl=%d}", c.bn, c.splits, c.pdl ? 1 : 0);
}
