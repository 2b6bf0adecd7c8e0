// The flag launches the distributed backends share (peer.cuh), and the fp32-accumulated row-block sum of gemm-rs.
// No torch here: binding.cpp files call these through peer_ops.h.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "launch_error.h"
#include "peer.cuh"
#include "peer_ops.h"

namespace {

// out[i] = bf16(sum over s in 0..count-1 of src_s[i]) in fp32, in source order (deterministic); waits first for
// flags[0 .. count) of this rank to reach `epoch`. 8 elements a thread.
__global__ void sum_rows_kernel(const __grid_constant__ kb::PeerPtrs srcs, int count, __nv_bfloat16* out, long long n8,
                                const uint32_t* flags, uint32_t epoch) {
  if (threadIdx.x < count) kb::sm90::wait_flag_sys(flags + threadIdx.x, epoch);
  __syncthreads();
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n8;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    float acc[8] = {};
    for (int s = 0; s < count; ++s) {
      const uint4 v = __ldcg(reinterpret_cast<const uint4*>(srcs.p[s]) + i);  // may be a peer's: not from L1
      const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float2 f = __bfloat1622float2(h[j]);
        acc[2 * j] += f.x;
        acc[2 * j + 1] += f.y;
      }
    }
    uint4 o;
    __nv_bfloat162* oh = reinterpret_cast<__nv_bfloat162*>(&o);
#pragma unroll
    for (int j = 0; j < 4; ++j) oh[j] = __floats2bfloat162_rn(acc[2 * j], acc[2 * j + 1]);
    reinterpret_cast<uint4*>(out)[i] = o;
  }
}

// Copies n16 16-byte words from src to byte `offset` of each of the `count` buffers `dsts` (SM stores: over NVLink
// where a buffer is a peer's), then the last block to finish (a ticket on `counter`, which it leaves at zero) stores
// `epoch` at word `word` of each buffer with a system-scope release. One launch for what a copy-engine copy and a
// flag launch a peer did before: the copy engine's start costs ~10 us a copy on a small shard.
__global__ void push_kernel(const __grid_constant__ kb::PeerPtrs dsts, int count, const uint4* src, long long offset,
                            long long n16, int word, uint32_t epoch, int* counter) {
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n16;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    const uint4 v = __ldg(src + i);
    for (int r = 0; r < count; ++r) reinterpret_cast<uint4*>(dsts.p[r] + offset)[i] = v;
  }
  kb::flag_when_last(dsts, count, word, epoch, counter);
}

}  // namespace

const char* peer_signal(const uint64_t* peers, int count, int word, uint32_t epoch, cudaStream_t stream) {
  kb::PeerPtrs p{};
  for (int i = 0; i < count; ++i) p.p[i] = peers[i];
  kb::signal_peers_kernel<<<1, 32, 0, stream>>>(p, count, word, epoch);
  return kb::launch_error("peer_signal");
}

const char* peer_wait(const uint32_t* flags, int first, int count, uint32_t epoch, cudaStream_t stream) {
  kb::wait_flags_kernel<<<1, 32, 0, stream>>>(flags, first, count, epoch);
  return kb::launch_error("peer_wait");
}

const char* peer_sum_rows(const uint64_t* srcs, int count, void* out, long long elems, const uint32_t* flags,
                          uint32_t epoch, cudaStream_t stream) {
  if (elems % 8) return "peer_sum_rows: the element count must be a multiple of 8";
  kb::PeerPtrs p{};
  for (int i = 0; i < count; ++i) p.p[i] = srcs[i];
  const long long n8 = elems / 8;
  const int blocks = static_cast<int>(n8 / 256 + 1 < 1056 ? n8 / 256 + 1 : 1056);
  sum_rows_kernel<<<blocks, 256, 0, stream>>>(p, count, static_cast<__nv_bfloat16*>(out), n8, flags, epoch);
  return kb::launch_error("peer_sum_rows");
}

const char* peer_push(const uint64_t* dsts, int count, const void* src, long long offset, long long bytes, int word,
                      uint32_t epoch, int* counter, int max_blocks, cudaStream_t stream) {
  if (bytes % 16 || offset % 16 || reinterpret_cast<uintptr_t>(src) % 16)
    return "peer_push: the bytes, the offset and the source must be multiples of 16";
  kb::PeerPtrs p{};
  for (int i = 0; i < count; ++i) p.p[i] = dsts[i];
  const long long n16 = bytes / 16;
  // a block a 256 x 4 words at most, and no more blocks than 2 a SM (enough stores in flight to fill NVLink) or
  // max_blocks where given (a push beside a GEMM that needs the other SMs)
  const long long cap = max_blocks > 0 ? max_blocks : 2 * kb::sm_count();
  const long long want = (n16 + 1023) / 1024;
  const int blocks = static_cast<int>(want < 1 ? 1 : want < cap ? want : cap);
  push_kernel<<<blocks, 256, 0, stream>>>(p, count, static_cast<const uint4*>(src), offset, n16, word, epoch, counter);
  return kb::launch_error("peer_push");
}
