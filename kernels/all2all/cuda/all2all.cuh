// MoE dispatch and combine straight over NVLink: every rank writes its (token, slot) copies into the receiving
// rank's symmetric buffer, the receiver's simulated expert writes y = x * (1 + rank) straight back into the sender's
// buffer, and the sender combines. Four launches, no host synchronisation, no NCCL:
//   plan      one block: each pair's destination rank and its slot in that rank's list from this source (pairs in
//             (token, slot) order), written with the pair ids and the counts into the destinations' buffers
//   dispatch  the token rows to their slots; the last block to finish flags each destination (epoch)
//   expert    waits for every source's flag, y = x * (1 + rank) for each received row, written to the source's
//             return rows (indexed by the source's pair id); the last block flags each source
//   combine   waits for every destination's flag; out[t] = sum over the token's experts in ascending id of
//             fp32(y) * weight, rounded to fp16 after every add (the reference's order and roundings)
// Buffers are reused across calls: flags carry the call's epoch, and a rank writes into a peer's buffer only after
// the flags of the previous call prove the peer is done reading it (docs/distributed-notes.md).
#pragma once
#include <cstdint>
#include <cuda_fp16.h>

#include "peer.cuh"

namespace a2a {

using kb::PeerPtrs;

constexpr int kPlanThreads = 256;
constexpr int kThreads = 256;
// flag words at the start of every buffer: [0, 8) dispatch flags by source, [8, 16) combine flags by destination
constexpr int kDispatchFlag = 0, kCombineFlag = 8;

struct Params {
  PeerPtrs peers;                 // every rank's buffer (peers.p[rank] is this rank's own)
  int rank, ws, T, K, H;
  int experts_per_rank;
  int P;                          // slots per source: max_num_tokens * K
  long long off_count;            // int32 [ws]: pairs each source sent here
  long long off_pair;             // int32 [ws][P]: the source's pair id (t*K + k) of each slot
  long long off_x;                // fp16 [ws][P][H]: the rows each source sent here
  long long off_ret;              // fp16 [P][H]: expert outputs returned to this rank, by its own pair id
  const __half* x;                // [T][H]
  const int* indices;             // [T][K] expert ids
  const float* weights;           // [T][K]
  __half* out;                    // [T][H]
  int* slot;                      // [T*K] scratch: each pair's slot in its destination's list
  int* done;                      // 2 counters, zero between launches: dispatch and expert blocks finished
  uint32_t epoch;
};

template <class T>
__device__ __forceinline__ T* at(const Params& p, int rank, long long offset) {
  return reinterpret_cast<T*>(p.peers.p[rank] + offset);
}

__global__ void __launch_bounds__(kPlanThreads) plan_kernel(const __grid_constant__ Params p) {
  __shared__ int cnt[kPlanThreads][kb::kMaxRanks];
  __shared__ int total[kb::kMaxRanks];
  const int pairs = p.T * p.K, tid = threadIdx.x;
  const int per = (pairs + kPlanThreads - 1) / kPlanThreads;
  const int lo = min(pairs, tid * per), hi = min(pairs, lo + per);
  int mine[kb::kMaxRanks] = {};
  for (int i = lo; i < hi; ++i) ++mine[p.indices[i] / p.experts_per_rank];
  for (int d = 0; d < p.ws; ++d) cnt[tid][d] = mine[d];
  __syncthreads();
  if (tid < p.ws) {  // exclusive scan over the threads, per destination: pairs keep their (token, slot) order
    int run = 0;
    for (int t = 0; t < kPlanThreads; ++t) {
      const int c = cnt[t][tid];
      cnt[t][tid] = run;
      run += c;
    }
    total[tid] = run;
  }
  __syncthreads();
  for (int d = 0; d < p.ws; ++d) mine[d] = cnt[tid][d];
  for (int i = lo; i < hi; ++i) {
    const int d = p.indices[i] / p.experts_per_rank;
    const int s = mine[d]++;
    p.slot[i] = s;
    at<int>(p, d, p.off_pair)[p.rank * p.P + s] = i;
  }
  if (tid < p.ws) at<int>(p, tid, p.off_count)[p.rank] = total[tid];
}

// Copies n16 16-byte words from src to dst, the block's threads striding.
__device__ __forceinline__ void copy_row(uint4* dst, const uint4* src, int n16) {
  for (int c = threadIdx.x; c < n16; c += blockDim.x) dst[c] = src[c];
}

__global__ void __launch_bounds__(kThreads) dispatch_kernel(const __grid_constant__ Params p) {
  const int pairs = p.T * p.K, n16 = p.H / 8;
  for (int i = blockIdx.x; i < pairs; i += gridDim.x) {
    const int d = p.indices[i] / p.experts_per_rank;
    __half* dst = at<__half>(p, d, p.off_x) + (static_cast<long long>(p.rank) * p.P + p.slot[i]) * p.H;
    copy_row(reinterpret_cast<uint4*>(dst), reinterpret_cast<const uint4*>(p.x + (i / p.K) * p.H), n16);
  }
  kb::flag_when_last(p.peers, p.ws, kDispatchFlag + p.rank, p.epoch, &p.done[0]);
}

// Spins until this rank's flags [word, word + ws) reach the call's epoch (every block, before reading what they guard).
__device__ __forceinline__ void wait_all(const Params& p, int word) {
  if (threadIdx.x < p.ws) kb::sm90::wait_flag_sys(at<uint32_t>(p, p.rank, 0) + word + threadIdx.x, p.epoch);
  __syncthreads();
}

__global__ void __launch_bounds__(kThreads) expert_kernel(const __grid_constant__ Params p) {
  wait_all(p, kDispatchFlag);
  __shared__ int first[kb::kMaxRanks + 1];  // item offsets by source: items = all (source, slot) received
  if (threadIdx.x == 0) {
    first[0] = 0;
    for (int s = 0; s < p.ws; ++s)
      first[s + 1] = first[s] + static_cast<int>(kb::sm90::ld_acquire_sys(
                                    reinterpret_cast<const uint32_t*>(at<int>(p, p.rank, p.off_count)) + s));
  }
  __syncthreads();
  const __half2 scale = __float2half2_rn(static_cast<float>(1 + p.rank));
  const int n16 = p.H / 8;
  for (int item = blockIdx.x; item < first[p.ws]; item += gridDim.x) {
    int s = 0;
    while (item >= first[s + 1]) ++s;
    const int j = item - first[s];
    const int pair = __ldcg(at<int>(p, p.rank, p.off_pair) + s * p.P + j);  // written by a peer: not from L1
    const uint4* src = reinterpret_cast<const uint4*>(at<__half>(p, p.rank, p.off_x) +
                                                      (static_cast<long long>(s) * p.P + j) * p.H);
    uint4* dst = reinterpret_cast<uint4*>(at<__half>(p, s, p.off_ret) + static_cast<long long>(pair) * p.H);
    for (int c = threadIdx.x; c < n16; c += blockDim.x) {
      uint4 v = __ldcg(src + c);
      __half2* h = reinterpret_cast<__half2*>(&v);
#pragma unroll
      for (int e = 0; e < 4; ++e) h[e] = __hmul2(h[e], scale);  // the simulated expert, in fp16 as the reference
      dst[c] = v;
    }
  }
  kb::flag_when_last(p.peers, p.ws, kCombineFlag + p.rank, p.epoch, &p.done[1]);
}

__global__ void __launch_bounds__(kThreads) combine_kernel(const __grid_constant__ Params p) {
  wait_all(p, kCombineFlag);
  const int t = blockIdx.x;
  if (t >= p.T) return;  // the one block launched for a rank with no tokens: it only waits
  int order[8];
  float w[8];
  const int K = p.K;
  for (int k = 0; k < K; ++k) order[k] = k;
  for (int a = 1; a < K; ++a)  // the token's slots by ascending expert id (K <= 8)
    for (int b = a; b > 0 && p.indices[t * K + order[b]] < p.indices[t * K + order[b - 1]]; --b) {
      const int tmp = order[b];
      order[b] = order[b - 1];
      order[b - 1] = tmp;
    }
  for (int k = 0; k < K; ++k) w[k] = p.weights[t * K + order[k]];
  const __half* ret = at<__half>(p, p.rank, p.off_ret);
  for (int c = threadIdx.x; c < p.H / 8; c += blockDim.x) {
    float acc[8] = {};
    for (int k = 0; k < K; ++k) {
      const uint4 v = __ldcg(reinterpret_cast<const uint4*>(ret + static_cast<long long>(t * K + order[k]) * p.H) + c);
      const __half* y = reinterpret_cast<const __half*>(&v);
#pragma unroll
      for (int e = 0; e < 8; ++e)  // out = fp16(fp32(out) + fp32(y) * w): no fused multiply-add, as the reference
        acc[e] = __half2float(__float2half_rn(__fadd_rn(acc[e], __fmul_rn(__half2float(y[e]), w[k]))));
    }
    uint4 o;
    __half* oh = reinterpret_cast<__half*>(&o);
#pragma unroll
    for (int e = 0; e < 8; ++e) oh[e] = __float2half_rn(acc[e]);
    reinterpret_cast<uint4*>(p.out + static_cast<long long>(t) * p.H)[c] = o;
  }
}

}  // namespace a2a
