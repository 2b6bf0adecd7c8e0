// Host side of the all2all CUDA backend: one cooperative launch (fused.cuh), or the four launches of the previous
// path (all2all.cuh), on the caller's stream.
#include <cuda_runtime.h>

#include <algorithm>

#include "a2a_api.h"
#include "all2all.cuh"
#include "fused.cuh"
#include "launch_error.h"

namespace {

int sm_count() {
  static int sms = 0;
  if (!sms) {
    int dev = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  }
  return sms;
}

const char* run_fused(const A2aArgs& a, cudaStream_t stream) {
  if (a.T > a.P) return "all2all cuda: more tokens than max_num_tokens";
  a2a::FusedParams p{};
  for (int r = 0; r < a.ws; ++r) p.peers.p[r] = a.peers[r];
  p.rank = a.rank;
  p.ws = a.ws;
  p.T = a.T;
  p.K = a.K;
  p.H = a.H;
  p.M = a.P;
  p.experts_per_rank = a.experts_per_rank;
  p.off_count = a.off_count;
  p.off_tok = a.off_pair;
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
    resident = std::max(1, per_sm) * sm_count();
  }
  // a block per token (dispatch, combine) or per received row (expert), up to two a SM: more only lengthen the
  // tickets
  const int want = std::max({1, a.T, (a.ws - 1) * a.P});
  int blocks = std::min({want, resident, 2 * sm_count()});
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

}  // namespace

const char* a2a_run(const A2aArgs& a, cudaStream_t stream) {
  if (a.ws < 1 || a.ws > kb::kMaxRanks) return "all2all cuda: 1 to 8 ranks";
  if (a.K > 8 || a.H % 8) return "all2all cuda: experts_per_token <= 8 and hidden_dim a multiple of 8";
  if (a.fused) return run_fused(a, stream);
  if (a.T * a.K > a.P) return "all2all cuda: more (token, slot) pairs than max_num_tokens allows";
  a2a::Params p{};
  for (int r = 0; r < a.ws; ++r) p.peers.p[r] = a.peers[r];
  p.rank = a.rank;
  p.ws = a.ws;
  p.T = a.T;
  p.K = a.K;
  p.H = a.H;
  p.experts_per_rank = a.experts_per_rank;
  p.P = a.P;
  p.off_count = a.off_count;
  p.off_pair = a.off_pair;
  p.off_x = a.off_x;
  p.off_ret = a.off_ret;
  p.x = static_cast<const __half*>(a.x);
  p.indices = a.indices;
  p.weights = a.weights;
  p.out = static_cast<__half*>(a.out);
  p.slot = a.slot;
  p.done = a.done;
  p.epoch = a.epoch;
  const int sms = sm_count();
  // Every launch has at least one block, also for a rank with no tokens: its dispatch must still flag the peers,
  // and its combine must still wait for theirs (that wait is what lets the next call write into their buffers).
  const int pairs = a.T * a.K;
  const int dispatch_blocks = pairs < 1 ? 1 : pairs < 2 * sms ? pairs : 2 * sms;
  a2a::plan_kernel<<<1, a2a::kPlanThreads, 0, stream>>>(p);
  a2a::dispatch_kernel<<<dispatch_blocks, a2a::kThreads, 0, stream>>>(p);
  a2a::expert_kernel<<<2 * sms, a2a::kThreads, 0, stream>>>(p);
  a2a::combine_kernel<<<a.T < 1 ? 1 : a.T, a2a::kThreads, 0, stream>>>(p);
  return kb::launch_error("all2all cuda");
}
