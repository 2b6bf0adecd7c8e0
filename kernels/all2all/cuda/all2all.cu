// Host side of the all2all CUDA backend: the four launches of one call, back to back on one stream.
#include <cuda_runtime.h>

#include "a2a_api.h"
#include "all2all.cuh"
#include "launch_error.h"

const char* a2a_run(const A2aArgs& a, cudaStream_t stream) {
  if (a.ws < 1 || a.ws > kb::kMaxRanks) return "all2all cuda: 1 to 8 ranks";
  if (a.K > 8 || a.H % 8) return "all2all cuda: experts_per_token <= 8 and hidden_dim a multiple of 8";
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
  static int sms = 0;
  if (!sms) {
    int dev = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  }
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
