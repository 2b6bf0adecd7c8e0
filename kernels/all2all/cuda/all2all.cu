// Host side of the all2all CUDA backend: one cooperative launch of fused.cuh's kernel on the caller's stream.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>

#include "a2a_api.h"
#include "fused.cuh"
#include "launch_error.h"

const char* a2a_run(const A2aArgs& a, cudaStream_t stream) {
  if (a.ws < 1 || a.ws > kb::kMaxRanks) return "all2all cuda: 1 to 8 ranks";
  if (a.K > 8 || a.H % 8) return "all2all cuda: experts_per_token <= 8 and hidden_dim a multiple of 8";
  if (a.T > a.M) return "all2all cuda: more tokens than max_num_tokens";
  a2a::FusedParams p{};
  for (int r = 0; r < a.ws; ++r) p.peers.p[r] = a.peers[r];
  p.rank = a.rank;
  p.ws = a.ws;
  p.T = a.T;
  p.K = a.K;
  p.H = a.H;
  p.M = a.M;
  p.experts_per_rank = a.experts_per_rank;
  p.off_count = a.off_count;
  p.off_tok = a.off_tok;
  p.off_x = a.off_x;
  p.off_ret = a.off_ret;
  p.x = static_cast<const __half*>(a.x);
  p.indices = a.indices;
  p.weights = a.weights;
  p.out = static_cast<__half*>(a.out);
  p.done = a.done;
  p.epoch = a.epoch;
  p.trace = a.trace;
  static int resident = 0;  // blocks that fit the device at once: the grid's blocks wait on each other's peers
  if (!resident) {
    int per_sm = 0;
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, a2a::fused_kernel, a2a::kFusedThreads, 0);
    resident = std::max(1, per_sm) * kb::sm_count();
  }
  // a block per token (dispatch, combine) or per received row (expert), up to two a SM: more only lengthen the
  // tickets. Every launch has at least one block, also for a rank with no tokens: it must still flag its peers and
  // wait for theirs (that wait is what lets the next call write into their buffers).
  int blocks = std::min({std::max({1, a.T, (a.ws - 1) * a.M}), resident, 2 * kb::sm_count()});
  if (a.max_blocks > 0) blocks = std::min(blocks, a.max_blocks);
  void* args[] = {&p};
  const cudaError_t err = cudaLaunchCooperativeKernel(reinterpret_cast<const void*>(a2a::fused_kernel), blocks,
                                                      a2a::kFusedThreads, args, 0, stream);
  if (err != cudaSuccess) {
    static thread_local char msg[160];
    snprintf(msg, sizeof(msg), "all2all cuda: cooperative launch of %d blocks failed: %s", blocks,
             cudaGetErrorString(err));
    return msg;
  }
  return kb::launch_error("all2all cuda");
}
