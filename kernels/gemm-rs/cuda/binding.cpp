// Torch-facing side of the gemm-rs CUDA backend: the flag launches (signal_peers, wait_flags) and the reduction of
// the partial row blocks (sum_rows); the GEMMs themselves are cuBLAS calls from entry.py.
#include <c10/cuda/CUDAGuard.h>

#include "peer_binding.h"

// out [rows, n] bf16 = sum of the bf16 [rows, n] arrays at `srcs` (this rank's or peers' buffers), in that order,
// fp32 accumulation; waits for this rank's flag words [0, len(srcs)) to reach `epoch` first.
void sum_rows(torch::Tensor out, std::vector<int64_t> srcs, int64_t flags, int64_t epoch) {
  TORCH_CHECK(out.is_cuda() && out.scalar_type() == at::kBFloat16 && out.is_contiguous(),
              "sum_rows: out must be a contiguous bf16 CUDA tensor");
  const c10::cuda::CUDAGuard guard(out.device());
  const auto s = kbpeer::addresses(srcs);
  kbpeer::check(peer_sum_rows(s.data(), static_cast<int>(s.size()), out.data_ptr(), out.numel(),
                              reinterpret_cast<const uint32_t*>(flags), static_cast<uint32_t>(epoch),
                              c10::cuda::getCurrentCUDAStream().stream()));
}
