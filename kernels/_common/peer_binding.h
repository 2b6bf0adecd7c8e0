// The torch-facing wrappers of peer_ops.h, included by the distributed backends' binding.cpp (one definition each).
#pragma once
#include <c10/cuda/CUDAStream.h>
#include <torch/extension.h>

#include <vector>

#include "peer_ops.h"

namespace kbpeer {

inline std::vector<uint64_t> addresses(const std::vector<int64_t>& v) {
  TORCH_CHECK(!v.empty() && v.size() <= 8, "1 to 8 peer addresses");
  return std::vector<uint64_t>(v.begin(), v.end());
}

inline void check(const char* err) { TORCH_CHECK(err == nullptr, err ? err : ""); }

// A symmetric buffer as one rank sees it (gemm-rs's and ag-gemm's one-call paths): every rank's base address, this
// rank's flag words, the byte offset of half 0 and the size of each half (symm.py half), this rank's index.
struct Plan {
  std::vector<uint64_t> peers;
  uint64_t flags;
  int64_t half0, half_size;
  int rank;
  // The byte offset of call `epoch`'s half (calls alternate halves by parity, as symm.py's half does).
  uint64_t half_at(int64_t epoch) const { return half0 + (epoch % 2) * half_size; }
};

// The plans registered so far. (static: one store a binding; an inline function's static local is one object a
// process, which every binding loaded would share: _common/held_graphs.h.)
static inline std::vector<Plan>& plans() {
  static std::vector<Plan> held;
  return held;
}

// Registers a plan and returns its number.
static inline int64_t add_plan(const std::vector<int64_t>& peers, int64_t flags, int64_t half0, int64_t half_size,
                               int64_t rank) {
  const auto p = addresses(peers);
  TORCH_CHECK(rank >= 0 && rank < static_cast<int64_t>(p.size()), "plan: rank out of range");
  plans().push_back(Plan{p, static_cast<uint64_t>(flags), half0, half_size, static_cast<int>(rank)});
  return static_cast<int64_t>(plans().size()) - 1;
}

static inline const Plan& plan_at(int64_t plan) {
  TORCH_CHECK(plan >= 0 && plan < static_cast<int64_t>(plans().size()), "unknown plan ", plan);
  return plans()[plan];
}

}  // namespace kbpeer

// Registers the peers' addresses of a buffer once per shape (kbpeer::Plan, from symm.py's plan_args); returns the
// plan's number, which a binding's one-call path (rs_forward, ag_forward) takes.
int64_t peer_plan(std::vector<int64_t> peers, int64_t flags, int64_t half0, int64_t half_size, int64_t rank) {
  return kbpeer::add_plan(peers, flags, half0, half_size, rank);
}

// Store `epoch` at word `word` of each peer buffer, on the current stream after its earlier work.
void signal_peers(std::vector<int64_t> peers, int64_t word, int64_t epoch) {
  const auto p = kbpeer::addresses(peers);
  kbpeer::check(peer_signal(p.data(), static_cast<int>(p.size()), static_cast<int>(word),
                            static_cast<uint32_t>(epoch), c10::cuda::getCurrentCUDAStream().stream()));
}

// Hold the current stream until this rank's flag words [first, first + count) reach `epoch`.
void wait_flags(int64_t flags, int64_t first, int64_t count, int64_t epoch) {
  kbpeer::check(peer_wait(reinterpret_cast<const uint32_t*>(flags), static_cast<int>(first),
                          static_cast<int>(count), static_cast<uint32_t>(epoch),
                          c10::cuda::getCurrentCUDAStream().stream()));
}

// Copy `src` (contiguous, CUDA) to byte `offset` of each buffer in `dsts`, then store `epoch` at word `word` of each,
// on the current stream (counter: int32 [1], zeroed once, left zeroed), in at most max_blocks blocks where > 0.
void push_peers(torch::Tensor src, std::vector<int64_t> dsts, int64_t offset, int64_t word, int64_t epoch,
                torch::Tensor counter, int64_t max_blocks) {
  TORCH_CHECK(src.is_cuda() && src.is_contiguous(), "push_peers: src must be a contiguous CUDA tensor");
  TORCH_CHECK(counter.is_cuda() && counter.scalar_type() == at::kInt && counter.numel() >= 1,
              "push_peers: counter must be an int32 CUDA tensor");
  const auto d = kbpeer::addresses(dsts);
  kbpeer::check(peer_push(d.data(), static_cast<int>(d.size()), src.data_ptr(), offset,
                          static_cast<long long>(src.numel()) * src.element_size(), static_cast<int>(word),
                          static_cast<uint32_t>(epoch), counter.data_ptr<int>(), static_cast<int>(max_blocks),
                          c10::cuda::getCurrentCUDAStream().stream()));
}
