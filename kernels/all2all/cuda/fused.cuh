// MoE dispatch and combine straight over NVLink in one launch, each token crossing once per destination rank.
// The simulated expert of this problem is the same function of the row for every expert of a rank
// (y = x * (1 + rank)), so a token with several experts on rank d needs x sent to d once and y sent back once; the
// source then runs the reference's combine chain itself, reading y of rank d for each of the token's experts there
// (bit-identical to the reference: the chain's order and roundings are unchanged). At world size 2 with top-8 of
// 256 experts this moves ~4x fewer bytes each way than a row per (token, expert) pair.
//
// One cooperative launch of G co-resident blocks; each block, in turn:
//   dispatch  the destination ranks of every token (a bit mask), each (token, rank) row's slot in that rank's list
//             from this source (a block-wide scan over the tokens in order); the block copies the rows of its own
//             tokens (t % G == block) into the peers' receive buffers; the last block to finish stores the counts
//             and flags each peer (epoch)
//   expert    waits for every peer's flag, y = x * (1 + rank) for each received row, stored straight into the
//             source's return rows [rank][token]; the last block flags each source
//   combine   waits for every peer's flag; out[t] = sum over the token's experts in ascending id of fp32(y) * weight,
//             rounded to fp16 after every add; y of this rank's own experts is computed from x in place
// Blocks wait on peers, and peers on every block of this grid, so all G blocks must be resident at once: the host
// launches cooperatively (the launch fails rather than deadlocks if they cannot be). Buffers are reused across
// calls without a barrier (docs/distributed-notes.md): a rank writes into a peer's receive rows of call N+1 only
// after that peer's return flag N (sent after its last read of them), and a peer writes return rows of call N+1 only
// after this rank's dispatch flag N+1 (sent after its combine N).
#pragma once
#include <cstdint>
#include <cuda_fp16.h>

#include "peer.cuh"

namespace a2a {

constexpr int kFusedThreads = 256;
constexpr int kFusedWarps = kFusedThreads / 32;
constexpr int kFlagDispatch = 0, kFlagReturn = 8;  // flag words: [0, 8) by source, [8, 16) by destination
constexpr int kUnroll = 4;                         // 16-byte words in flight per thread in a row copy
constexpr int kCombineUnroll = 2;                  // 16-byte chunks of a token's row per thread at once in combine

struct FusedParams {
  kb::PeerPtrs peers;    // every rank's buffer (peers.p[rank] is this rank's own)
  int rank, ws, T, K, H;
  int M;                 // max_num_tokens: rows a source can send a rank
  int experts_per_rank;
  long long off_count;   // int32 [ws]: rows each source sent here this call
  long long off_tok;     // int32 [ws][M]: the source's token id of each received row
  long long off_x;       // fp16 [ws][M][H]: rows received, by source and slot
  long long off_ret;     // fp16 [ws][M][H]: y returned to this rank, by destination rank and token
  const __half* x;       // [T][H]
  const int* indices;    // [T][K] expert ids
  const float* weights;  // [T][K]
  __half* out;           // [T][H]
  int* done;             // 2 counters, zero between calls: blocks past dispatch, blocks past expert
  uint32_t epoch;
  unsigned long long* trace;  // kA2aTraceWords phase stamps (a2a_api.h), or nullptr
};

// Phase stamp i (a2a_api.h's kA2aTraceWords order) by block 0's first thread, or by whoever calls it with any_block.
__device__ __forceinline__ void stamp(const FusedParams& p, int i, bool any_block = false) {
  if (p.trace != nullptr && (any_block || (blockIdx.x == 0 && threadIdx.x == 0)))
    p.trace[i] = static_cast<unsigned long long>(kb::sm90::global_ns());
}

template <class T>
__device__ __forceinline__ T* region(const FusedParams& p, int rank, long long offset) {
  return reinterpret_cast<T*>(p.peers.p[rank] + offset);
}

// dst[c] = src[c] * scale (fp16, as the reference's simulated expert; scale 1 copies) for c < n16 16-byte words, the
// block's threads striding with kUnroll loads in flight each. src is read through L2 (a peer may have written it).
__device__ __forceinline__ void scaled_row(uint4* dst, const uint4* src, int n16, __half2 scale, bool multiply) {
  for (int c0 = threadIdx.x; c0 < n16; c0 += kUnroll * kFusedThreads) {
    uint4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (c0 + u * kFusedThreads < n16) v[u] = __ldcg(src + c0 + u * kFusedThreads);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (c0 + u * kFusedThreads >= n16) break;
      if (multiply) {
        __half2* h = reinterpret_cast<__half2*>(&v[u]);
#pragma unroll
        for (int e = 0; e < 4; ++e) h[e] = __hmul2(h[e], scale);
      }
      dst[c0 + u * kFusedThreads] = v[u];
    }
  }
}

// v's eight fp16 values times s (the simulated expert's fp16 multiply).
__device__ __forceinline__ uint4 scaled(uint4 v, __half2 s) {
  __half2* h = reinterpret_cast<__half2*>(&v);
#pragma unroll
  for (int e = 0; e < 4; ++e) h[e] = __hmul2(h[e], s);
  return v;
}

// Bit d set: the token has an expert on rank d.
__device__ __forceinline__ int token_mask(const FusedParams& p, int t) {
  int m = 0;
  for (int k = 0; k < p.K; ++k) m |= 1 << (__ldg(p.indices + t * p.K + k) / p.experts_per_rank);
  return m;
}

// Threads d < ws (d != rank) spin until this rank's flag `word + d` reaches the call's epoch; then the block goes on.
__device__ __forceinline__ void wait_peers(const FusedParams& p, int word) {
  const int d = threadIdx.x;
  if (d < p.ws && d != p.rank) kb::sm90::wait_flag_sys(region<uint32_t>(p, p.rank, 0) + word + d, p.epoch);
  __syncthreads();
}

struct Owned {
  int t, mask;
  int slot[kb::kMaxRanks];
};

__device__ void dispatch(const FusedParams& p) {
  __shared__ Owned owned[kFusedThreads];
  __shared__ int warp_count[kFusedWarps][kb::kMaxRanks];
  __shared__ int run[kb::kMaxRanks];  // rows per destination among the tokens before this chunk
  __shared__ int n_owned;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, G = gridDim.x;
  const int n16 = p.H / 8;
  if (tid < kb::kMaxRanks) run[tid] = 0;
  for (int base = 0; base < p.T; base += kFusedThreads) {
    if (tid == 0) n_owned = 0;
    const int t = base + tid;
    const int m = t < p.T ? token_mask(p, t) : 0;
    int before[kb::kMaxRanks];
#pragma unroll
    for (int d = 0; d < kb::kMaxRanks; ++d) {
      const unsigned b = __ballot_sync(0xffffffffu, (m >> d) & 1);
      before[d] = __popc(b & ((1u << lane) - 1));
      if (lane == 0) warp_count[warp][d] = __popc(b);
    }
    __syncthreads();
    if (t < p.T && t % G == static_cast<int>(blockIdx.x)) {
      const int i = atomicAdd(&n_owned, 1);
      owned[i].t = t;
      owned[i].mask = m;
#pragma unroll
      for (int d = 0; d < kb::kMaxRanks; ++d) {
        int s = run[d] + before[d];
        for (int w = 0; w < warp; ++w) s += warp_count[w][d];
        owned[i].slot[d] = s;
      }
    }
    __syncthreads();
    if (tid < kb::kMaxRanks)
      for (int w = 0; w < kFusedWarps; ++w) run[tid] += warp_count[w][tid];
    for (int i = 0; i < n_owned; ++i) {
      const int ot = owned[i].t, om = owned[i].mask;
      for (int d = 0; d < p.ws; ++d) {
        if (d == p.rank || !((om >> d) & 1)) continue;
        const long long row = static_cast<long long>(p.rank) * p.M + owned[i].slot[d];
        if (tid == 0) region<int>(p, d, p.off_tok)[row] = ot;
        scaled_row(reinterpret_cast<uint4*>(region<__half>(p, d, p.off_x) + row * p.H),
                   reinterpret_cast<const uint4*>(p.x + static_cast<long long>(ot) * p.H), n16, __half2{}, false);
      }
    }
    __syncthreads();  // owned[] and warp_count[] are rewritten by the next chunk
  }
  stamp(p, 1);
  kb::when_last(&p.done[0], [&] {
    for (int d = 0; d < p.ws; ++d)
      if (d != p.rank) region<int>(p, d, p.off_count)[p.rank] = run[d];
    for (int d = 0; d < p.ws; ++d)  // the release orders the counts and (after the fences) every block's rows
      if (d != p.rank) kb::sm90::st_release_sys(region<uint32_t>(p, d, 0) + kFlagDispatch + p.rank, p.epoch);
    stamp(p, 2, true);
  });
}

__device__ void expert(const FusedParams& p) {
  wait_peers(p, kFlagDispatch);
  stamp(p, 3);
  __shared__ int first[kb::kMaxRanks + 1];  // item offsets by source: items = rows received from every peer
  if (threadIdx.x == 0) {
    first[0] = 0;
    for (int s = 0; s < p.ws; ++s)
      first[s + 1] = first[s] + (s == p.rank ? 0
                                            : static_cast<int>(kb::sm90::ld_acquire_sys(
                                                  region<uint32_t>(p, p.rank, p.off_count) + s)));
  }
  __syncthreads();
  const __half2 scale = __float2half2_rn(static_cast<float>(1 + p.rank));
  const int n16 = p.H / 8;
  for (int item = blockIdx.x; item < first[p.ws]; item += gridDim.x) {
    int s = 0;
    while (item >= first[s + 1]) ++s;
    const long long row = static_cast<long long>(s) * p.M + (item - first[s]);
    const int t = __ldcg(region<int>(p, p.rank, p.off_tok) + row);
    scaled_row(reinterpret_cast<uint4*>(region<__half>(p, s, p.off_ret) +
                                        (static_cast<long long>(p.rank) * p.M + t) * p.H),
               reinterpret_cast<const uint4*>(region<__half>(p, p.rank, p.off_x) + row * p.H), n16, scale, true);
  }
  kb::when_last(&p.done[1], [&] {
    for (int s = 0; s < p.ws; ++s)
      if (s != p.rank) kb::sm90::st_release_sys(region<uint32_t>(p, s, 0) + kFlagReturn + p.rank, p.epoch);
    stamp(p, 4, true);
  });
}

__device__ void combine(const FusedParams& p) {
  wait_peers(p, kFlagReturn);
  stamp(p, 5);
  const int K = p.K, n16 = p.H / 8;
  const __half2 own_scale = __float2half2_rn(static_cast<float>(1 + p.rank));
  for (int t = blockIdx.x; t < p.T; t += gridDim.x) {
    int id[8], rank_of[8];
    float w[8];
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      id[k] = k < K ? __ldg(p.indices + t * K + k) : 0x7fffffff;
      w[k] = k < K ? __ldg(p.weights + t * K + k) : 0.f;
    }
#pragma unroll
    for (int i = 0; i < 7; ++i)  // ascending expert id, as the reference's argsort (K <= 8; the pads sort last)
#pragma unroll
      for (int j = 0; j < 7 - i; ++j)
        if (id[j] > id[j + 1]) {
          const int ti = id[j];
          id[j] = id[j + 1];
          id[j + 1] = ti;
          const float tw = w[j];
          w[j] = w[j + 1];
          w[j + 1] = tw;
        }
#pragma unroll
    for (int k = 0; k < 8; ++k) rank_of[k] = k < K ? id[k] / p.experts_per_rank : p.rank;
    const uint4* xrow = reinterpret_cast<const uint4*>(p.x + static_cast<long long>(t) * p.H);
    const uint4* ret = reinterpret_cast<const uint4*>(region<__half>(p, p.rank, p.off_ret) +
                                                      static_cast<long long>(t) * p.H);
    const long long rank_stride = static_cast<long long>(p.M) * p.H / 8;  // 16-byte words between ranks' rows
    uint4* orow = reinterpret_cast<uint4*>(p.out + static_cast<long long>(t) * p.H);
    // kCombineUnroll chunks a thread at once, every expert's y loaded before the chain (those of one rank are the
    // same row, so the repeats hit L2 together): one latency a chunk, where loading inside the chain cost one per
    // expert
    for (int c0 = threadIdx.x; c0 < n16; c0 += kCombineUnroll * kFusedThreads) {
      uint4 y[kCombineUnroll][8];
#pragma unroll
      for (int u = 0; u < kCombineUnroll; ++u) {
        const int c = min(c0 + u * kFusedThreads, n16 - 1);  // (a chunk past the row recomputes the last one)
        const uint4 own = scaled(__ldg(xrow + c), own_scale);
#pragma unroll
        for (int k = 0; k < 8; ++k)
          y[u][k] = k < K && rank_of[k] != p.rank ? __ldcg(ret + rank_of[k] * rank_stride + c) : own;
      }
#pragma unroll
      for (int u = 0; u < kCombineUnroll; ++u) {
        const int c = c0 + u * kFusedThreads;
        float acc[8] = {};
#pragma unroll
        for (int k = 0; k < 8; ++k) {
          const __half* yh = reinterpret_cast<const __half*>(&y[u][k]);
#pragma unroll
          for (int e = 0; e < 8; ++e)  // out = fp16(fp32(out) + fp32(y) * w): no fused multiply-add, as the reference
            if (k < K) acc[e] = __half2float(__float2half_rn(__fadd_rn(acc[e], __fmul_rn(__half2float(yh[e]), w[k]))));
        }
        uint4 o;
        __half* oh = reinterpret_cast<__half*>(&o);
#pragma unroll
        for (int e = 0; e < 8; ++e) oh[e] = __float2half_rn(acc[e]);
        if (c < n16) orow[c] = o;
      }
    }
  }
}

__global__ void __launch_bounds__(kFusedThreads, 2) fused_kernel(const __grid_constant__ FusedParams p) {
  stamp(p, 0);
  dispatch(p);
  expert(p);
  combine(p);
  __syncthreads();
  stamp(p, 6);
}

}  // namespace a2a
