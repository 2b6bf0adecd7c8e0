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
