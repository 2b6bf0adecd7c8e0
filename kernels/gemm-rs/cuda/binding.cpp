// Torch-facing side of the gemm-rs CUDA backend: the whole call in one extension call (rs_forward: the GEMMs through
// ATen into the owners' symmetric buffers, the flags and the deterministic sum), with the peers' addresses registered
// once per shape (peer_plan); and the pieces the Python path calls (signal_peers, wait_flags, sum_rows).
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>

#include "knobs.h"
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

// The call of entry.py's docstring: a [m, k/ws] and w [n, k/ws] bf16, bias [n] or None; epoch: the call's number
// (every rank counts the same calls), its parity the buffer half. Returns this rank's rows [m/ws, n] of the sum.
// Rows an owner from KBENCH_RS_CHUNK_ROWS (default chunk_rows) on: a GEMM per owner into the owner's buffer, this
// rank's own last, each flagged to its owner; below: one GEMM into this rank's buffer, flagged to every rank, which
// pull their rows while they sum.
torch::Tensor rs_forward(torch::Tensor a, torch::Tensor w, c10::optional<torch::Tensor> bias, int64_t plan,
                         int64_t epoch, int64_t chunk_rows) {
  const kbpeer::Plan& pl = kbpeer::plan_at(plan);
  TORCH_CHECK(a.is_cuda() && a.scalar_type() == at::kBFloat16 && w.scalar_type() == at::kBFloat16 && a.dim() == 2 &&
                  w.dim() == 2 && a.size(1) == w.size(1),
              "rs_forward: a [m, k] and w [n, k] must be bf16 CUDA tensors of one k");
  const int ws = static_cast<int>(pl.peers.size());
  const int64_t m = a.size(0), n = w.size(0), rows = m / ws;
  TORCH_CHECK(m % ws == 0 && (rows * n) % 8 == 0, "rs_forward: m must split evenly and rows x n be a multiple of 8");
  TORCH_CHECK(2 * m * n <= pl.half_size, "rs_forward: the plan's buffer is smaller than this call needs");
  const c10::cuda::CUDAGuard guard(a.device());
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
  const uint64_t base = pl.half_at(epoch);
  const auto opts = a.options();
  const auto wt = w.t();
  const auto gemm = [&](const torch::Tensor& src, uint64_t at_address, int64_t out_rows) {
    // (target_device: a peer's buffer is mapped into this device's address space, but from_blob would otherwise
    // ask the driver whose memory it is and refuse the peer's device)
    torch::Tensor dst =
        at::for_blob(reinterpret_cast<void*>(at_address), {out_rows, n}).options(opts).target_device(a.device())
            .make_tensor();
    if (bias) at::addmm_out(dst, *bias, src, wt);
    else at::mm_out(dst, src, wt);
  };
  torch::Tensor out = at::empty({rows, n}, opts);
  std::vector<uint64_t> slots(ws);
  const int64_t slot_bytes = rows * n * 2;
  if (rows >= kb::env_int("KBENCH_RS_CHUNK_ROWS", static_cast<int>(chunk_rows))) {
    for (int i = 1; i <= ws; ++i) {  // owners r+1, r+2, ..., r: this rank's own block last
      const int dst = (pl.rank + i) % ws;
      gemm(a.narrow(0, dst * rows, rows), pl.peers[dst] + base + pl.rank * slot_bytes, rows);
      kbpeer::check(peer_signal(&pl.peers[dst], 1, pl.rank, static_cast<uint32_t>(epoch), stream));
    }
    for (int s = 0; s < ws; ++s) slots[s] = pl.peers[pl.rank] + base + s * slot_bytes;
  } else {
    gemm(a, pl.peers[pl.rank] + base, m);
    kbpeer::check(peer_signal(pl.peers.data(), ws, pl.rank, static_cast<uint32_t>(epoch), stream));
    for (int s = 0; s < ws; ++s) slots[s] = pl.peers[s] + base + pl.rank * slot_bytes;
  }
  kbpeer::check(peer_sum_rows(slots.data(), ws, out.data_ptr(), out.numel(),
                              reinterpret_cast<const uint32_t*>(pl.flags), static_cast<uint32_t>(epoch), stream));
  return out;
}
