// Torch-facing side of the all2all CUDA backend: checks the tensors, hands raw pointers (and the peers' buffer
// addresses, the layout's offsets and the call's epoch, all decided in entry.py) to all2all.cu.
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/extension.h>

#include <vector>

#include "a2a_api.h"

// x [T, H] fp16, indices [T, K] int32, weights [T, K] fp32 (this rank's); peers: every rank's buffer address;
// layout: [P, off_count, off_pair, off_x, off_ret] (layout.py: `fused_layout` when fused, where P is max_num_tokens
// and off_pair the token ids' region; else `layout`); scratch int32 [T*K + 2] (its last two zero between calls).
// Returns out [T, H] fp16.
torch::Tensor a2a_forward(torch::Tensor x, torch::Tensor indices, torch::Tensor weights, std::vector<int64_t> peers,
                          int64_t rank, int64_t experts_per_rank, std::vector<int64_t> layout, torch::Tensor scratch,
                          int64_t epoch, bool fused) {
  TORCH_CHECK(x.is_cuda() && x.scalar_type() == at::kHalf && x.is_contiguous() && x.dim() == 2,
              "a2a_forward: x must be contiguous fp16 [T, H]");
  TORCH_CHECK(indices.scalar_type() == at::kInt && weights.scalar_type() == at::kFloat && indices.is_contiguous() &&
                  weights.is_contiguous() && indices.sizes() == weights.sizes() && indices.size(0) == x.size(0),
              "a2a_forward: indices (int32) and weights (fp32) must be contiguous [T, K]");
  TORCH_CHECK(layout.size() == 5 && peers.size() >= 1 && peers.size() <= 8, "a2a_forward: bad layout or peers");
  TORCH_CHECK(scratch.scalar_type() == at::kInt && scratch.numel() >= indices.numel() + 2,
              "a2a_forward: scratch must be int32 [T*K + 2]");
  const c10::cuda::CUDAGuard guard(x.device());
  torch::Tensor out = torch::empty_like(x);
  A2aArgs a{};
  for (size_t r = 0; r < peers.size(); ++r) a.peers[r] = static_cast<uint64_t>(peers[r]);
  a.rank = static_cast<int>(rank);
  a.ws = static_cast<int>(peers.size());
  a.T = static_cast<int>(x.size(0));
  a.K = static_cast<int>(indices.size(1));
  a.H = static_cast<int>(x.size(1));
  a.experts_per_rank = static_cast<int>(experts_per_rank);
  a.P = static_cast<int>(layout[0]);
  a.off_count = layout[1];
  a.off_pair = layout[2];
  a.off_x = layout[3];
  a.off_ret = layout[4];
  a.x = x.data_ptr();
  a.indices = indices.data_ptr<int>();
  a.weights = weights.data_ptr<float>();
  a.out = out.data_ptr();
  a.slot = scratch.data_ptr<int>();
  a.done = scratch.data_ptr<int>() + scratch.numel() - 2;
  a.epoch = static_cast<uint32_t>(epoch);
  a.fused = fused;
  const char* err = a2a_run(a, c10::cuda::getCurrentCUDAStream().stream());
  TORCH_CHECK(err == nullptr, err ? err : "");
  return out;
}
