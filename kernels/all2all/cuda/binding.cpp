// Torch-facing side of the all2all CUDA backend. entry.py registers a plan once per shape (the peers' buffer
// addresses and the layout, decided in Python); each call then hands only the inputs and the plan's number,
// and everything else (checks, dtype fixes, the output, the epoch, the knobs) happens here: the official window is
// a host clock around the call, and each Python-level step costs ~1-3 us of it.
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/extension.h>

#include <cstdint>
#include <vector>

#include "a2a_api.h"
#include "held_graphs.h"  // kb::StepTimes
#include "knobs.h"

namespace {

struct Plan {
  std::vector<int64_t> peers;
  std::vector<int64_t> layout;  // layout.layout(...).offsets(): [M, off_count, off_tok, off_x, off_ret]
  torch::Tensor done;           // int32 [2], zero between calls: the kernel's tickets
};

std::vector<Plan>& plans() {
  static std::vector<Plan> held;
  return held;
}

uint32_t& epoch() {  // this process's call count, the same on every rank (all ranks call together)
  static uint32_t n = 0;
  return n;
}

kb::StepTimes& steps() {  // the host's steps of the last call (a2a_steps)
  static kb::StepTimes held;
  return held;
}

torch::Tensor& trace_buffer() {  // int64 [kA2aTraceWords] on the device once a call was traced, else undefined
  static torch::Tensor t;
  return t;
}

}  // namespace

// Registers a plan and returns its number. peers: every rank's buffer address; layout: layout.py's offsets();
// done: int32 [2] on the GPU, zeroed.
int64_t a2a_plan(std::vector<int64_t> peers, std::vector<int64_t> layout, torch::Tensor done) {
  TORCH_CHECK(peers.size() >= 1 && peers.size() <= 8 && layout.size() == 5, "a2a_plan: 1 to 8 peers, 5 offsets");
  TORCH_CHECK(done.is_cuda() && done.scalar_type() == at::kInt && done.numel() == 2,
              "a2a_plan: done must be int32 [2] on the GPU");
  plans().push_back(Plan{peers, layout, done});
  return static_cast<int64_t>(plans().size()) - 1;
}

// x [T, H] fp16, indices [T, K] (int32; other integer types converted), weights [T, K] (fp32; converted) of this
// rank; plan: a2a_plan's number; experts_per_rank = num_experts / world_size. Returns out [T, H] fp16.
// Read every call: KBENCH_A2A_TRACE=1 stamps the kernel's phases (a2a_trace); KBENCH_A2A_BLOCKS=N caps its grid
// at N blocks (a candidate; default: a block per token or received row, up to two a SM).
torch::Tensor a2a_forward(torch::Tensor x, torch::Tensor indices, torch::Tensor weights, int64_t plan, int64_t rank,
                          int64_t experts_per_rank) {
  steps().start();
  TORCH_CHECK(plan >= 0 && plan < static_cast<int64_t>(plans().size()), "a2a_forward: unknown plan");
  const Plan& pl = plans()[plan];
  TORCH_CHECK(x.is_cuda() && x.scalar_type() == at::kHalf && x.dim() == 2, "a2a_forward: x must be fp16 [T, H]");
  x = x.contiguous();
  indices = indices.to(at::kInt).contiguous();
  weights = weights.to(at::kFloat).contiguous();
  TORCH_CHECK(indices.dim() == 2 && indices.sizes() == weights.sizes() && indices.size(0) == x.size(0),
              "a2a_forward: indices and weights must be [T, K] for x [T, H]");
  const c10::cuda::CUDAGuard guard(x.device());
  steps().mark("checks");
  torch::Tensor out = torch::empty_like(x);
  steps().mark("output");
  A2aArgs a{};
  for (size_t r = 0; r < pl.peers.size(); ++r) a.peers[r] = static_cast<uint64_t>(pl.peers[r]);
  a.rank = static_cast<int>(rank);
  a.ws = static_cast<int>(pl.peers.size());
  a.T = static_cast<int>(x.size(0));
  a.K = static_cast<int>(indices.size(1));
  a.H = static_cast<int>(x.size(1));
  a.experts_per_rank = static_cast<int>(experts_per_rank);
  a.M = static_cast<int>(pl.layout[0]);
  a.off_count = pl.layout[1];
  a.off_tok = pl.layout[2];
  a.off_x = pl.layout[3];
  a.off_ret = pl.layout[4];
  a.x = x.data_ptr();
  a.indices = indices.data_ptr<int>();
  a.weights = weights.data_ptr<float>();
  a.out = out.data_ptr();
  a.done = pl.done.data_ptr<int>();
  a.epoch = ++epoch();
  a.trace = nullptr;
  a.max_blocks = kb::env_int("KBENCH_A2A_BLOCKS", 0);
  if (kb::env_is("KBENCH_A2A_TRACE", "1")) {
    if (!trace_buffer().defined())
      trace_buffer() = torch::zeros({kA2aTraceWords}, x.options().dtype(at::kLong));
    a.trace = reinterpret_cast<unsigned long long*>(trace_buffer().data_ptr<int64_t>());
  }
  const char* err = a2a_run(a, c10::cuda::getCurrentCUDAStream().stream());
  steps().mark("launch");
  TORCH_CHECK(err == nullptr, err ? err : "");
  return out;
}

// The last call's host steps inside the binding, [(name, us)], and when it entered the binding (ns of the clock
// time.perf_counter_ns reads): a benchmark subtracts its own clock before the call to get the Python before it.
std::pair<std::vector<std::pair<std::string, double>>, int64_t> a2a_steps() {
  return {steps().last(), steps().start_ns()};
}

// The last traced call's phase stamps (ns of the GPU's global timer; a2a_api.h names them), int64 [kA2aTraceWords]
// on the CPU (synchronizes); empty when no call was traced.
torch::Tensor a2a_trace() {
  if (!trace_buffer().defined()) return torch::empty({0}, torch::dtype(at::kLong));
  return trace_buffer().cpu();
}
