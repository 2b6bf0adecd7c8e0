// The MoE layer's data movement around the two grouped GEMMs, all on the device (no host synchronisation):
//   route_kernel    sort the (token, slot) pairs by expert: counts, offsets, m-tile offsets, the permutation both ways
//   route_count_kernel, route_place_kernel   the same sort over many blocks (MoeConfig::split_route)
//   gather_kernel   copy each token's row to its K places in expert order (GEMM 1's A operand, read by TMA; loading
//                   one row a TMA box inside GEMM 1 instead made it 4.5x slower, docs/moe-notes.md); with
//                   red_combine also zero the token's output row, which GEMM 2 then adds into
//   combine_kernel  out[t] = shared(t) + sum_k score[t, k] * expert_k(t), summed in fp32 in slot order, rounded once
//   publish_kernel  the output's address into device memory for red_combine (a graph replays with a new output)
#pragma once
#include <cstdint>
#include <cuda_fp16.h>

#include "grouped_gemm.cuh"  // kMaxGroups, kBM
#include "late_address.h"

namespace moe {

constexpr int kRouteThreads = 1024;

// meta (see GemmParams) from the groups' row counts, by one thread: meta[g] = group g's first row, meta[G] = all
// rows, meta[G + 1 + g] = its first m-tile, meta[2G + 1] = all m-tiles (G = E + 1). Groups: E routed experts, then
// the shared expert with all T tokens. rows_from(g, row): routed group g's row count, told its first row (from which
// the caller hands out the group's rows). meta null: only the rows are handed out.
template <class RowsFrom>
__device__ __forceinline__ void lay_out_groups(int T, int E, int* meta, RowsFrom&& rows_from) {
  const int G = E + 1;
  int row = 0, mtile = 0;
  for (int g = 0; g < G; ++g) {
    if (meta) {
      meta[g] = row;
      meta[G + 1 + g] = mtile;
    }
    const int rows = g < E ? rows_from(g, row) : T;
    row += rows;
    mtile += (rows + kBM - 1) / kBM;
  }
  if (meta) {
    meta[G] = row;
    meta[2 * G + 1] = mtile;
  }
}

// One block. experts [T*K] (int64, torch.topk's indices); writes meta (see GemmParams), rows_pair ([T*K]: for each
// expert-sorted row, its pair index t*K + k) and its inverse pair_row ([T*K]: the sorted row of pair t*K + k).
// Groups: E routed experts, then the shared expert with all T tokens. Each warp counts its own pairs (pair i belongs
// to warp (i / 32) % 32), so the shared-memory atomics contend only within a warp; expert e's rows are ordered by
// warp, then by arrival.
__global__ void __launch_bounds__(kRouteThreads) route_kernel(const int64_t* __restrict__ experts, int T, int K,
                                                              int E, int* __restrict__ meta,
                                                              int* __restrict__ rows_pair,
                                                              int* __restrict__ pair_row) {
  constexpr int kWarps = kRouteThreads / 32, kBatch = 16;
  __shared__ int cnt[kWarps][kMaxGroups];  // per warp, per expert: count, then the warp's first row of the expert
  const int pairs = T * K, warp = threadIdx.x / 32;
  for (int i = threadIdx.x; i < kWarps * kMaxGroups; i += blockDim.x) (&cnt[0][0])[i] = 0;
  __syncthreads();
  // One block streams every pair twice: kBatch independent loads in flight per thread before their atomics, or the
  // passes are a chain of global-memory latencies (87 us at 32768 pairs with one load at a time).
  auto for_pairs = [&](auto&& visit) {
    for (int base = 0; base < pairs; base += kBatch * kRouteThreads) {
      int e[kBatch];
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        const int i = base + j * kRouteThreads + threadIdx.x;
        e[j] = i < pairs ? static_cast<int>(experts[i]) : -1;
      }
#pragma unroll
      for (int j = 0; j < kBatch; ++j)
        if (e[j] >= 0 && e[j] < E) visit(base + j * kRouteThreads + threadIdx.x, e[j]);
    }
  };
  for_pairs([&](int, int e) { atomicAdd(&cnt[warp][e], 1); });
  __syncthreads();
  if (threadIdx.x == 0)
    lay_out_groups(T, E, meta, [&](int g, int row) {
      int rows = 0;
      for (int w = 0; w < kWarps; ++w) {  // counts -> each warp's first row of expert g
        const int c = cnt[w][g];
        cnt[w][g] = row + rows;
        rows += c;
      }
      return rows;
    });
  __syncthreads();
  for_pairs([&](int i, int e) {
    const int pos = atomicAdd(&cnt[warp][e], 1);
    rows_pair[pos] = i;
    pair_row[i] = pos;
  });
}

// The split sort (split_route): pairs in chunks of kRouteChunk, one block a chunk. The one-block route_kernel spends
// 23 / 56 us at 2048 / 8192 tokens streaming every pair through one SM twice; here each SM sees 2048 pairs.
constexpr int kRouteChunk = 2048;
constexpr int kRoutePerThread = kRouteChunk / kRouteThreads;

inline int route_blocks(int pairs) { return (pairs + kRouteChunk - 1) / kRouteChunk; }

// The chunk's expert ids (-1 past the end), all loads in flight before any use.
__device__ __forceinline__ void load_chunk(const int64_t* __restrict__ experts, int pairs, int (&e)[kRoutePerThread]) {
#pragma unroll
  for (int j = 0; j < kRoutePerThread; ++j) {
    const int i = blockIdx.x * kRouteChunk + j * kRouteThreads + threadIdx.x;
    e[j] = i < pairs ? static_cast<int>(experts[i]) : -1;
  }
}

// hist[b][e] = how many pairs of chunk b chose expert e (hist: [route_blocks(pairs)][E]). late (a graph's launch
// with MoeConfig::late_output): block 0's first thread also takes the call's output address from the host and writes
// it where the later launches read it (the gather zeroes the output two launches on).
__global__ void __launch_bounds__(kRouteThreads) route_count_kernel(const int64_t* __restrict__ experts, int pairs,
                                                                    int E, int* __restrict__ hist,
                                                                    kb::LateAddress late) {
  __shared__ int cnt[kMaxGroups];
  for (int i = threadIdx.x; i < E; i += blockDim.x) cnt[i] = 0;
  int e[kRoutePerThread];
  load_chunk(experts, pairs, e);
  __syncthreads();
#pragma unroll
  for (int j = 0; j < kRoutePerThread; ++j)
    if (e[j] >= 0 && e[j] < E) atomicAdd(&cnt[e[j]], 1);
  __syncthreads();
  for (int i = threadIdx.x; i < E; i += blockDim.x) hist[blockIdx.x * E + i] = cnt[i];
  if (late.ring && blockIdx.x == 0 && threadIdx.x == 0) kb::take_late_address(late);
}

// route_kernel's outputs from the chunks' counts: expert e's rows start at the sum of all smaller experts' counts,
// and chunk b's rows of e after the earlier chunks' (so every chunk knows its places without the others). Within a
// chunk, rows of one expert go in arrival order at the shared-memory counter. Block 0 writes meta.
// hist: hist_rows rows of E counts, rows_per_chunk a chunk (1 from route_count_kernel, 8 from router_topk_kernel).
// late: block 0's first thread takes the call's output address once its rows are placed (router_topk_kernel's
// launches: the last moment before the GEMMs, so that a speculative launch's GPU waits least for the host's
// comparison: moe_replay).
__global__ void __launch_bounds__(kRouteThreads) route_place_kernel(const int64_t* __restrict__ experts, int T, int K,
                                                                    int E, const int* __restrict__ hist,
                                                                    int hist_rows, int rows_per_chunk,
                                                                    int* __restrict__ meta,
                                                                    int* __restrict__ rows_pair,
                                                                    int* __restrict__ pair_row,
                                                                    kb::LateAddress late) {
  __shared__ int next[kMaxGroups];   // this chunk's next row of expert e
  __shared__ int total[kMaxGroups];  // expert e's rows over all chunks
  const int pairs = T * K;
  int e[kRoutePerThread];
  load_chunk(experts, pairs, e);
  // a warp an expert, its lanes striding the rows (router_topk_kernel leaves 8 rows a chunk: 128 at 8192 tokens),
  // kLoads rows' loads in flight a lane before their sums (one at a time, the rows were a chain of L2 round trips:
  // +2.5 us at 8192 tokens)
  constexpr int kLoads = 8;
  const int mine = static_cast<int>(blockIdx.x) * rows_per_chunk, lane = threadIdx.x % 32;
  for (int g = threadIdx.x / 32; g < E; g += kRouteThreads / 32) {
    int before = 0, all = 0;
    for (int b0 = lane; b0 < hist_rows; b0 += 32 * kLoads) {
      int c[kLoads];
#pragma unroll
      for (int j = 0; j < kLoads; ++j) c[j] = b0 + 32 * j < hist_rows ? hist[(b0 + 32 * j) * E + g] : 0;
#pragma unroll
      for (int j = 0; j < kLoads; ++j) {
        before += b0 + 32 * j < mine ? c[j] : 0;
        all += c[j];
      }
    }
    before = __reduce_add_sync(0xffffffffu, before);
    all = __reduce_add_sync(0xffffffffu, all);
    if (lane == 0) {
      next[g] = before;
      total[g] = all;
    }
  }
  __syncthreads();
  if (threadIdx.x == 0)
    lay_out_groups(T, E, blockIdx.x == 0 ? meta : nullptr, [&](int g, int row) {
      next[g] += row;
      return total[g];
    });
  __syncthreads();
#pragma unroll
  for (int j = 0; j < kRoutePerThread; ++j) {
    if (e[j] >= 0 && e[j] < E) {
      const int i = blockIdx.x * kRouteChunk + j * kRouteThreads + threadIdx.x;
      const int pos = atomicAdd(&next[e[j]], 1);
      rows_pair[pos] = i;
      pair_row[i] = pos;
    }
  }
  if (late.ring && blockIdx.x == 0 && threadIdx.x == 0) kb::take_late_address(late);
}

// xs[pair_row[t*K + k]] = x[t] for every token t and slot k; one block per token, 16-byte copies, d % 8 == 0.
// Token order: each row of x is read once (in expert order each is read K times, and x outgrows L2 at 8192
// tokens: 117 MB). out_slot (red_combine): also zero row t of the output *out_slot, in stream order before GEMM 2
// adds into it.
__global__ void gather_kernel(const __half* __restrict__ x, const int* __restrict__ pair_row, __half* __restrict__ xs,
                              int K, int d, __half* const* __restrict__ out_slot) {
  __shared__ uint4* dst[kMaxGroups];  // the token's K rows of xs (K <= routed experts < kMaxGroups)
  if (out_slot && *out_slot == nullptr) return;  // a speculative launch called off (GemmParams::abort_slot)
  const int t = blockIdx.x;
  if (threadIdx.x < K)
    dst[threadIdx.x] = reinterpret_cast<uint4*>(xs + static_cast<long long>(pair_row[t * K + threadIdx.x]) * d);
  __syncthreads();
  const uint4* src = reinterpret_cast<const uint4*>(x + static_cast<long long>(t) * d);
  uint4* zero_row = out_slot ? reinterpret_cast<uint4*>(*out_slot + static_cast<long long>(t) * d) : nullptr;
  for (int c = threadIdx.x; c < d / 8; c += blockDim.x) {
    const uint4 v = src[c];
    for (int k = 0; k < K; ++k) dst[k][c] = v;
    if (zero_row) zero_row[c] = make_uint4(0, 0, 0, 0);
  }
}

__global__ void publish_kernel(void** slot, void* out) { *slot = out; }

// out[t] = fp16(y_shared[t] + sum_k score[t, k] * y[t*K + k]) in fp32; one thread per 8 columns of a token.
// y: [T*K + T][d] (pair rows, then the shared expert's rows); scores fp16 [T][K].
__global__ void combine_kernel(const __half* __restrict__ y, const __half* __restrict__ scores,
                               __half* __restrict__ out, int T, int K, int d) {
  const long long idx = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int chunks = d / 8;
  if (idx >= static_cast<long long>(T) * chunks) return;
  const int t = static_cast<int>(idx / chunks), c = static_cast<int>(idx % chunks);
  float acc[8];
  {
    const uint4 v = *reinterpret_cast<const uint4*>(y + (static_cast<long long>(T) * K + t) * d + c * 8);
    const __half2* h = reinterpret_cast<const __half2*>(&v);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float2 f = __half22float2(h[j]);
      acc[2 * j] = f.x;
      acc[2 * j + 1] = f.y;
    }
  }
  for (int k = 0; k < K; ++k) {
    const float w = __half2float(scores[static_cast<long long>(t) * K + k]);
    const uint4 v = *reinterpret_cast<const uint4*>(y + (static_cast<long long>(t) * K + k) * d + c * 8);
    const __half2* h = reinterpret_cast<const __half2*>(&v);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float2 f = __half22float2(h[j]);
      acc[2 * j] += w * f.x;
      acc[2 * j + 1] += w * f.y;
    }
  }
  uint4 o;
  __half2* oh = reinterpret_cast<__half2*>(&o);
#pragma unroll
  for (int j = 0; j < 4; ++j) oh[j] = __floats2half2_rn(acc[2 * j], acc[2 * j + 1]);
  *reinterpret_cast<uint4*>(out + static_cast<long long>(t) * d + c * 8) = o;
}

}  // namespace moe
