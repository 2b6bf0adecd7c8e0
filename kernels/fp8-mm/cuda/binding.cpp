// Torch-facing side of the fp8-mm CUDA backend: validates and normalises layouts, keeps the scratch buffers
// (allocated through the caching allocator), and hands raw pointers to kernel.cu. The only file that sees torch.
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/extension.h>

#include <cstdio>
#include <mutex>

#include "fp8_gemm_api.h"
#include "knobs.h"
#include "torch_check.h"

namespace {

bool is_kmajor(const torch::Tensor& t) { return t.stride(1) == 1 && t.stride(0) == t.size(1); }
bool is_colmajor(const torch::Tensor& t) { return t.stride(0) == 1 && t.stride(1) == t.size(0); }

// KBENCH_PRINT_CONFIG=1: the configuration chosen for each new shape, once, to stderr (knobs.h).
void maybe_print(int64_t m, int64_t n, int64_t k, const GemmConfig& c) {
  kb::print_config_once([&](char* buf, int size) {
    const int len = snprintf(buf, size, "fp8_gemm %lldx%lldx%lld: ", (long long)m, (long long)n, (long long)k);
    fp8_gemm_describe(c, buf + len, size - len);
  });
}

// A scratch buffer of at least `bytes` for role `slot` (0: A's K-major copy, 1: B's, 2: the split-K workspace).
// keep (KBENCH_FP8_HOST_CACHE, default 1): it stays allocated from one call to the next, where torch::empty took
// 3.0-9.0 us of host time each before the first launch under the profiler (benchmarks/host_gap.py --host-trace,
// forty-third session). A kept buffer serves only calls on the stream that last used it (stream order makes the
// reuse safe) and never a stream that is capturing a graph (a capture's allocations belong to its pool); those get
// a fresh one, as every call did before. (Held by a leaked table: no tensor destructor runs at process exit.)
torch::Tensor scratch(int slot, int64_t bytes, const torch::Tensor& like, cudaStream_t stream, bool keep) {
  const auto opts = like.options().dtype(torch::kUInt8);
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (!keep || cudaStreamIsCapturing(stream, &status) != cudaSuccess || status != cudaStreamCaptureStatusNone)
    return torch::empty({bytes}, opts);
  struct Kept {
    torch::Tensor t;
    cudaStream_t stream = nullptr;
  };
  static Kept* kept = new Kept[64 * 3];
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  Kept& k = kept[(like.get_device() & 63) * 3 + slot];
  if (!k.t.defined() || k.stream != stream || k.t.numel() < bytes) {
    k.t = torch::Tensor();  // freed first, so the allocator may hand the block back
    k.t = torch::empty({bytes}, opts);
    k.stream = stream;
  }
  return k.t;
}

// a [m,k], b [n,k] fp8 e4m3fnuz; a_scale [m,k/128], b_scale [ceil(n/128),k/128] fp32; c [m,n] bf16 (written).
// config: nullptr = the automatic one for the shape.
torch::Tensor run(torch::Tensor a, torch::Tensor b, torch::Tensor a_scale, torch::Tensor b_scale, torch::Tensor c,
                  const GemmConfig* config) {
  TORCH_CHECK(a.is_cuda() && b.is_cuda() && a_scale.is_cuda() && b_scale.is_cuda() && c.is_cuda(),
              "fp8_gemm: all inputs must be CUDA tensors (move them with .cuda())");
  TORCH_CHECK(a.scalar_type() == at::kFloat8_e4m3fnuz && b.scalar_type() == at::kFloat8_e4m3fnuz,
              "fp8_gemm: a and b must be float8_e4m3fnuz (the kernel folds the fnuz->e4m3fn factor of 2 per operand)");
  TORCH_CHECK(a_scale.scalar_type() == at::kFloat && b_scale.scalar_type() == at::kFloat,
              "fp8_gemm: a_scale and b_scale must be float32");
  TORCH_CHECK(c.scalar_type() == at::kBFloat16, "fp8_gemm: c must be bfloat16");
  TORCH_CHECK(a.dim() == 2 && b.dim() == 2 && a.size(1) == b.size(1),
              "fp8_gemm: need a [m,k] and b [n,k] with the same k");
  const int64_t m = a.size(0), n = b.size(0), k = a.size(1);
  KB_CHECK(m % 16 == 0 && n % 16 == 0 && k % 128 == 0 && m > 0 && n > 0,
           "fp8_gemm: need m and n multiples of 16 and k a multiple of 128, got m=%lld n=%lld k=%lld",
           static_cast<long long>(m), static_cast<long long>(n), static_cast<long long>(k));
  TORCH_CHECK(a_scale.dim() == 2 && a_scale.size(0) == m && a_scale.size(1) == k / 128,
              "fp8_gemm: a_scale must be [m, k/128]");
  TORCH_CHECK(b_scale.dim() == 2 && b_scale.size(0) == (n + 127) / 128 && b_scale.size(1) == k / 128,
              "fp8_gemm: b_scale must be [ceil(n/128), k/128]");
  TORCH_CHECK(c.dim() == 2 && c.size(0) == m && c.size(1) == n, "fp8_gemm: c must be [m, n]");
  const c10::cuda::CUDAGuard guard(a.device());

  const GemmConfig plan = config ? *config : fp8_gemm_config(m, n, k, fp8_gemm_num_sms());
  maybe_print(m, n, k, plan);

  // The transpose pass reads column-major operands (what the problem hands over); other layouts are normalised
  // to that, except that the FP8 path takes K-major operands as they are.
  const bool a_km = !plan.exact && is_kmajor(a), b_km = !plan.exact && is_kmajor(b);
  if (!a_km && !is_colmajor(a)) a = a.t().contiguous().t();
  if (!b_km && !is_colmajor(b)) b = b.t().contiguous().t();
  if (a_scale.stride(0) != 1 || a_scale.stride(1) % 4 != 0 || (reinterpret_cast<uintptr_t>(a_scale.data_ptr()) & 15))
    a_scale = a_scale.t().contiguous().t();  // M-major, leading dimension m (a multiple of 16)
  torch::Tensor out = c.is_contiguous() ? c : torch::empty({m, n}, c.options());

  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
  const bool keep = kb::env_int("KBENCH_FP8_HOST_CACHE", 1) != 0;
  const int64_t op_bytes = plan.exact ? 2 : 1;  // fp16 copies on the exact path, fp8 bytes otherwise
  torch::Tensor a_t = a_km ? torch::Tensor() : scratch(0, m * k * op_bytes, a, stream, keep);
  torch::Tensor b_t = b_km ? torch::Tensor() : scratch(1, n * k * op_bytes, a, stream, keep);
  // Split-K workspace: one zeroed [m][n] fp32 slice for atomics, or one slice per split.
  const int64_t ws_slices = plan.split_slices ? plan.splits : 1;
  torch::Tensor ws = plan.splits > 1 ? scratch(2, ws_slices * m * n * 4, a, stream, keep) : torch::Tensor();

  Fp8GemmArgs g{};
  g.a = static_cast<const uint8_t*>(a.data_ptr());
  g.b = static_cast<const uint8_t*>(b.data_ptr());
  g.a_kmajor = a_km;
  g.b_kmajor = b_km;
  g.a_t = a_km ? nullptr : a_t.data_ptr();
  g.b_t = b_km ? nullptr : b_t.data_ptr();
  g.sa = a_scale.data_ptr<float>();
  g.sa_ld = a_scale.stride(1);
  g.sb = b_scale.data_ptr<float>();
  g.sb_s0 = b_scale.stride(0);
  g.sb_s1 = b_scale.stride(1);
  g.c = static_cast<uint16_t*>(out.data_ptr());
  g.ws = plan.splits > 1 ? static_cast<float*>(ws.data_ptr()) : nullptr;
  g.m = static_cast<int>(m);
  g.n = static_cast<int>(n);
  g.k = static_cast<int>(k);
  g.host_cache = keep;
  const char* err = fp8_gemm_run(g, plan, stream);
  TORCH_CHECK(err == nullptr, err ? err : "");
  if (!out.is_same(c)) c.copy_(out);
  return c;
}

}  // namespace

// The leaderboard entry point: configuration chosen from the shape.
torch::Tensor fp8_gemm(torch::Tensor a, torch::Tensor b, torch::Tensor a_scale, torch::Tensor b_scale,
                       torch::Tensor c) {
  return run(a, b, a_scale, b_scale, c, nullptr);
}

#ifdef KBENCH_DEV
// Tuning and tests only (kernel.yml's dev block; never in the shipped submission): a forced configuration.
// schedule: 0 lock_step, 1 ordered, 2 alternating, 3 split_chains_early, 4 split_chains (gemm.cuh).
torch::Tensor fp8_gemm_with_config(torch::Tensor a, torch::Tensor b, torch::Tensor a_scale, torch::Tensor b_scale,
                                   torch::Tensor c, int64_t tile_n, int64_t splits, bool exact, int64_t schedule,
                                   bool half_c, bool split_slices) {
  TORCH_CHECK(tile_n == 64 || tile_n == 128, "fp8_gemm_with_config: tile_n must be 64 or 128");
  TORCH_CHECK(splits >= 1, "fp8_gemm_with_config: splits must be >= 1");
  TORCH_CHECK(schedule >= 0 && schedule <= 4, "fp8_gemm_with_config: schedule must be 0 to 4");
  GemmConfig config;
  config.tile_n = static_cast<int>(tile_n);
  config.splits = static_cast<int>(splits);
  config.exact = exact;
  config.schedule = static_cast<Schedule>(schedule);
  config.half_c = half_c;
  config.split_slices = split_slices;
  return run(a, b, a_scale, b_scale, c, &config);
}

// The configuration fp8_gemm would use for a shape on this device:
// [tile_n, splits, exact, schedule, half_c, split_slices].
std::vector<int64_t> fp8_gemm_config_for(int64_t m, int64_t n, int64_t k) {
  const GemmConfig c = fp8_gemm_config(static_cast<int>(m), static_cast<int>(n), static_cast<int>(k),
                                       fp8_gemm_num_sms());
  return {c.tile_n, c.splits, c.exact ? 1 : 0, static_cast<int64_t>(c.schedule), c.half_c ? 1 : 0,
          c.split_slices ? 1 : 0};
}
#endif  // KBENCH_DEV
