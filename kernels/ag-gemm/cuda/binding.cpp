// Torch-facing side of the ag-gemm CUDA backend: the gather-first call in one extension call (ag_forward: the push
// into every rank's buffer, the wait for every rank's flag, the GEMM through ATen), with the peers' addresses
// registered once per shape (peer_plan); and the pieces the Python paths call (signal_peers, wait_flags, push_peers).
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>

#include "knobs.h"
#include "peer_binding.h"

// entry.py's gather-first call: a [m/ws, k] and w [n/ws, k] bf16, bias [n/ws] or None; epoch: the call's number
// (every rank counts the same calls), its parity the buffer half; counter: push_peers' int32 ticket (zeroed once).
// This rank's shard goes into its slot of every rank's half (SM stores and a flag each, one launch; by the copy
// engine and a flag launch a rank where KBENCH_AG_PUSH=ce or the shard cannot take 16-byte stores), then the stream
// waits for every rank's flag and one GEMM reads the gathered [m, k]. Returns [m, n/ws].
torch::Tensor ag_forward(torch::Tensor a, torch::Tensor w, c10::optional<torch::Tensor> bias, int64_t plan,
                         int64_t epoch, torch::Tensor counter) {
  const kbpeer::Plan& pl = kbpeer::plan_at(plan);
  TORCH_CHECK(a.is_cuda() && a.scalar_type() == at::kBFloat16 && w.scalar_type() == at::kBFloat16 && a.dim() == 2 &&
                  w.dim() == 2 && a.size(1) == w.size(1),
              "ag_forward: a [m/ws, k] and w [n/ws, k] must be bf16 CUDA tensors of one k");
  TORCH_CHECK(counter.is_cuda() && counter.scalar_type() == at::kInt && counter.numel() >= 1,
              "ag_forward: counter must be an int32 CUDA tensor");
  const c10::cuda::CUDAGuard guard(a.device());
  a = a.contiguous();
  const int ws = static_cast<int>(pl.peers.size());
  const int64_t rows = a.size(0), k = a.size(1), m = rows * ws, n = w.size(0);
  const int64_t bytes = rows * k * 2;
  TORCH_CHECK(m * k * 2 <= pl.half_size, "ag_forward: the plan's buffer is smaller than this call needs");
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
  const uint64_t base = pl.half_at(epoch);
  const uint64_t mine = base + pl.rank * bytes;  // this rank's slot in every rank's half
  const auto e = static_cast<uint32_t>(epoch);
  const bool sm_storable = bytes % 16 == 0 && reinterpret_cast<uintptr_t>(a.data_ptr()) % 16 == 0;
  if (kb::env_is("KBENCH_AG_PUSH", "ce") || !sm_storable) {
    for (int i = 0; i < ws; ++i) {
      const int dst = (pl.rank + i) % ws;
      TORCH_CHECK(cudaMemcpyAsync(reinterpret_cast<void*>(pl.peers[dst] + mine), a.data_ptr(), bytes,
                                  cudaMemcpyDeviceToDevice, stream) == cudaSuccess,
                  "ag_forward: the shard's copy failed");
      kbpeer::check(peer_signal(&pl.peers[dst], 1, pl.rank, e, stream));
    }
  } else {
    kbpeer::check(peer_push(pl.peers.data(), ws, a.data_ptr(), static_cast<long long>(mine), bytes, pl.rank, e,
                            counter.data_ptr<int>(), 0, stream));
  }
  kbpeer::check(peer_wait(reinterpret_cast<const uint32_t*>(pl.flags), 0, ws, e, stream));
  const auto opts = a.options();
  torch::Tensor gathered = at::for_blob(reinterpret_cast<void*>(pl.peers[pl.rank] + base), {m, k})
                               .options(opts)
                               .target_device(a.device())
                               .make_tensor();
  torch::Tensor out = at::empty({m, n}, opts);
  if (bias) at::addmm_out(out, *bias, gathered, w.t());
  else at::mm_out(out, gathered, w.t());
  return out;
}
