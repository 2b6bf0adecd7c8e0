// The router's softmax and top-k in one launch, with ATen's numerics, plus the routing sort's per-block expert counts
// (route_count_kernel's job) of the pairs it picks: MoeConfig::fused_topk. Replaces three launches (ATen's
// softmax_warp_forward and sbtopk::gatherTopK, then route_count_kernel: 1.7 + 6.1 + 4.4 us at 2048 tokens, 2.3 +
// 15.6 + 4.6 at 8192; docs/moe-notes.md, forty-seventh session).
//
// Why ATen's numerics to the bit: the reference picks experts with `F.linear(...).softmax(-1)` then `torch.topk(...,
// sorted=False)`; fp16 probabilities tie often (32 values near 1/32, 2^-16 apart), and a token routed to another
// expert than the reference's fails the check. So the logits stay cuBLAS's (at::linear, as the reference) and this
// kernel repeats softmax_warp_forward's arithmetic (a row over min(next_pow2(E), 32) lanes, fp32, max and sum by the
// same xor butterfly, expf and an IEEE division, rounded to fp16) and gatherTopK's choice and order: the values above
// the k-th largest in index order, then those equal to it, lowest index first (its radix key orders fp16 values,
// NaN largest).
#pragma once
#include <cstdint>
#include <cuda_fp16.h>

#include "late_address.h"
#include "route.cuh"  // kRouteThreads, kRouteChunk, kMaxGroups

namespace moe {

// (token, slot) pairs a block of router_topk_kernel owns: its row of the counts, eight a routing chunk (two tokens
// a warp at K = 4: the rows' latency chains, not their arithmetic, set the kernel's time).
constexpr int kTopkPairs = 256;
static_assert(kRouteChunk % kTopkPairs == 0, "a routing chunk is whole rows of the top-k counts");

inline int topk_blocks(int pairs) { return (pairs + kTopkPairs - 1) / kTopkPairs; }

// gatherTopK's radix key of an fp16 value (ATen's TopKTypeConfig<Half>::convert): unsigned order = value order, NaN
// above everything.
__device__ __forceinline__ uint32_t topk_radix(__half v) {
  const uint32_t bits = __half_as_ushort(v);
  return __hisnan(v) ? 0xffffu : bits ^ ((bits & 0x8000u) ? 0xffffu : 0x8000u);
}

// One row's logits as softmax_warp_forward holds them (-inf past E).
template <int kLanes, int kPer>
__device__ __forceinline__ void load_logits(const __half* __restrict__ logits, int t, int E, int l, float (&v)[kPer]) {
#pragma unroll
  for (int it = 0; it < kPer; ++it) {
    const int e = l + it * kLanes;
    v[it] = e < E ? __half2float(logits[static_cast<long long>(t) * E + e]) : -INFINITY;
  }
}

// logits [T][E] fp16 (contiguous) -> scores [T][K] fp16 and experts [T][K] int64 (torch.topk(logits.softmax(-1), K,
// sorted=False)'s values and indices), and hist[blockIdx.x][e] = how many of the block's pairs chose expert e.
// Block b owns pairs [b * kTopkPairs, (b + 1) * kTopkPairs): it computes every token those touch and writes only its
// own pairs (a token across two blocks is computed by both, identically). kWidth = next_pow2(E) <= 64: a row on
// kLanes lanes, kPer values a lane (value l + it * kLanes on lane l), as softmax_warp_forward lays it out.
// late: as route_count_kernel (block 0's first thread takes the call's output address, here before its rows; moe_run
// passes none since the forty-eighth session: route_place_kernel takes it, later).
template <int kWidth>
__global__ void __launch_bounds__(kRouteThreads) router_topk_kernel(const __half* __restrict__ logits, int T, int K,
                                                                    int E, __half* __restrict__ scores,
                                                                    int64_t* __restrict__ experts,
                                                                    int* __restrict__ hist, kb::LateAddress late) {
  constexpr int kLanes = kWidth < 32 ? kWidth : 32, kPer = kWidth / kLanes, kRowsPerWarp = 32 / kLanes;
  constexpr int kStride = kRouteThreads / 32 * kRowsPerWarp;  // rows the block takes at a time
  // first: its read of mapped host memory crosses PCIe while the other warps pick
  if (late.ring && blockIdx.x == 0 && threadIdx.x == 0) kb::take_late_address(late);
  __shared__ int cnt[kMaxGroups];
  for (int i = threadIdx.x; i < E; i += blockDim.x) cnt[i] = 0;
  __syncthreads();
  const int first = blockIdx.x * kTopkPairs, end = min(T * K, first + kTopkPairs);
  const int lane = threadIdx.x % 32, group = lane / kLanes, l = lane % kLanes;
  const unsigned group_lanes = kLanes == 32 ? 0xffffffffu : ((1u << kLanes) - 1u) << (group * kLanes);
  const int t_end = (end - 1) / K + 1;
  int t = first / K + threadIdx.x / 32 * kRowsPerWarp + group;
  float next[kPer];  // the group's next row, loaded under this one's arithmetic
  if (t < t_end) load_logits<kLanes>(logits, t, E, l, next);
  // every lane of a row's group takes the same trips, so each group's shuffles see all of its lanes
  for (; t < t_end; t += kStride) {
    float v[kPer];
#pragma unroll
    for (int it = 0; it < kPer; ++it) v[it] = next[it];
    if (t + kStride < t_end) load_logits<kLanes>(logits, t + kStride, E, l, next);
    float m = v[0];
#pragma unroll
    for (int it = 1; it < kPer; ++it) m = m > v[it] ? m : v[it];
#pragma unroll
    for (int off = kLanes / 2; off > 0; off /= 2) {
      const float o = __shfl_xor_sync(group_lanes, m, off, kLanes);
      m = m > o ? m : o;
    }
    float s = 0.f;
#pragma unroll
    for (int it = 0; it < kPer; ++it) {
      v[it] = expf(v[it] - m);
      s += v[it];
    }
#pragma unroll
    for (int off = kLanes / 2; off > 0; off /= 2) s += __shfl_xor_sync(group_lanes, s, off, kLanes);
    // key: radix in the high half, 0xffff - index in the low (highest value, then lowest index wins); 0 = none
    __half p[kPer];
    uint32_t key[kPer];
#pragma unroll
    for (int it = 0; it < kPer; ++it) {
      const int e = l + it * kLanes;
      p[it] = __float2half_rn(v[it] / s);
      key[it] = e < E ? topk_radix(p[it]) << 16 | (0xffffu - e) : 0u;
    }
    bool taken[kPer];
#pragma unroll
    for (int it = 0; it < kPer; ++it) taken[it] = false;
    uint32_t kth = 0;  // the k-th largest value's radix
    for (int k = 0; k < K; ++k) {
      uint32_t best = 0;
#pragma unroll
      for (int it = 0; it < kPer; ++it) best = !taken[it] && key[it] > best ? key[it] : best;
      const uint32_t win = __reduce_max_sync(group_lanes, best);
#pragma unroll
      for (int it = 0; it < kPer; ++it) taken[it] = taken[it] || key[it] == win;
      kth = win >> 16;
    }
    // gatherTopK's order: the picks above the k-th value by index, then those equal to it by index
    unsigned above[kPer], equal[kPer];
    int n_above = 0;
#pragma unroll
    for (int it = 0; it < kPer; ++it) {
      const uint32_t radix = key[it] >> 16;
      above[it] = (__ballot_sync(group_lanes, taken[it] && radix > kth) & group_lanes) >> (group * kLanes);
      equal[it] = (__ballot_sync(group_lanes, taken[it] && radix == kth) & group_lanes) >> (group * kLanes);
      n_above += __popc(above[it]);
    }
    const unsigned lower = (1u << l) - 1u;
    int above_before = 0, equal_before = n_above;
#pragma unroll
    for (int it = 0; it < kPer; ++it) {
      if (taken[it]) {
        const bool is_above = (key[it] >> 16) > kth;
        const int slot = is_above ? above_before + __popc(above[it] & lower) : equal_before + __popc(equal[it] & lower);
        const int pair = t * K + slot, e = l + it * kLanes;
        if (pair >= first && pair < end) {
          scores[pair] = p[it];
          experts[pair] = e;
          atomicAdd(&cnt[e], 1);
        }
      }
      above_before += __popc(above[it]);
      equal_before += __popc(equal[it]);
    }
  }
  __syncthreads();
  for (int i = threadIdx.x; i < E; i += blockDim.x) hist[blockIdx.x * E + i] = cnt[i];
}

}  // namespace moe
