// Host side of the fp8-mm CUDA backend: picks a configuration, builds TMA tensor maps, launches
// transpose (when needed) -> GEMM -> (split-K) convert on one stream. No torch here; binding.cpp owns tensors.
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <algorithm>

#include "device_sms.h"
#include "fp8_gemm_api.h"
#include "gemm.cuh"
#include "tma_host.h"
#include "transpose.cuh"

namespace fp8mm {
namespace {

// 2-D map over a row-major [rows][cols] array with `pitch_bytes` between rows.
// cached: found by its arguments where an earlier call made the same map (Fp8GemmArgs::host_cache).
bool make_map(CUtensorMap* map, CUtensorMapDataType type, const void* ptr, uint64_t cols, uint64_t rows,
              uint64_t pitch_bytes, uint32_t box_cols, uint32_t box_rows, CUtensorMapSwizzle swz, bool cached) {
  return cached ? kb::cached_map_2d(map, type, ptr, cols, rows, pitch_bytes, box_cols, box_rows, swz)
                : kb::make_map_2d(map, type, ptr, cols, rows, pitch_bytes, box_cols, box_rows, swz);
}

template <int BN, bool kF16, int kSched = 0>
void set_smem_attrs() {
  cudaFuncSetAttribute(fp8_gemm_kernel<BN, kF16, kSched>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                       GemmShape<BN, (kSched & 8) != 0>::kSmemBytes);
}

// Launched with programmatic stream serialization (PDL): its CTAs may start while the transpose pass drains;
// the kernel executes griddepcontrol.wait before touching anything an earlier kernel wrote.
template <int BN, bool kF16, int kSched = 0>
cudaError_t launch_gemm(int grid, cudaStream_t stream, const CUtensorMap& a, const CUtensorMap& b,
                        const CUtensorMap& sa, const GemmParams& p) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(grid);
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = GemmShape<BN, (kSched & 8) != 0>::kSmemBytes;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cudaLaunchKernelEx(&cfg, fp8_gemm_kernel<BN, kF16, kSched>, a, b, sa, p);
}

// The SM count (one CTA an SM), every GEMM instance's shared-memory size set on the device's first call.
int num_sms() {
  return kb::sm_count_after([] {
    set_smem_attrs<128, true>();
    set_smem_attrs<128, false>();
    set_smem_attrs<64, true>();
    set_smem_attrs<64, false>();
    set_smem_attrs<128, true, 1>();
    set_smem_attrs<128, true, 2>();
    set_smem_attrs<64, true, 1>();
    set_smem_attrs<64, true, 2>();
    set_smem_attrs<128, true, 3>();
    set_smem_attrs<128, true, 4>();
    set_smem_attrs<64, true, 3>();
    set_smem_attrs<64, true, 4>();
    set_smem_attrs<128, true, 8>();
    set_smem_attrs<128, true, 11>();
  });
}

int ceil_div(long long a, long long b) { return static_cast<int>((a + b - 1) / b); }

}  // namespace
}  // namespace fp8mm

using namespace fp8mm;

GemmConfig fp8_gemm_config(int m, int n, int k, int sms) {
  // 128 x 128 tiles everywhere: 64-wide tiles re-read A from shared memory and lost on every shape measured
  // (docs/fp8-mm-notes.md, v1-v10 with the measurements behind each rule).
  const int tiles = ceil_div(m, kBM) * ceil_div(n, 128);
  const int kb = k / 128;
  GemmConfig c;
  // Split K when the tiles fill less than half the GPU ...
  if (2 * tiles <= sms) c.splits = std::max(1, std::min({4, sms / tiles, kb / 8}));
  // ... or when a second wave would be less than half full and k is long (6144x512x7168: 192 tiles = 1.45 waves
  // -> 2.9 waves of half-length units, -3.6% measured; at 1.8 and 2.2 waves the slice traffic ate the gain).
  else if (tiles > sms && 2 * tiles <= 3 * sms && kb >= 32)
    c.splits = 2;
  // Split-K partials in per-split fp32 slices with plain stores, summed by the finishing pass: no memset and no
  // L2 atomics (-9% / -8% on 1024x576x7168 / 1024x512x7168 against the red.add version).
  c.split_slices = ceil_div(kb, ceil_div(kb, c.splits)) > 1;
  // Short k (<= 4 blocks per tile): C staged in column halves for a 6th pipeline stage, so the next tile's loads
  // run under the epilogue (-1.5 to -3.5% on 6144x7168x256 / 6144x4096x512; even or slower on long k).
  c.half_c = kb <= 4;
  return c;
}

void fp8_gemm_describe(const GemmConfig& c, char* buf, int size) {
  static const char* names[] = {"lock_step", "ordered", "alternating", "split_chains_early", "split_chains"};
  snprintf(buf, size, "GemmConfig{tile_n=%d, splits=%d, %s, %s%s%s}", c.tile_n, c.splits,
           c.exact ? "exact" : "fp8_mma", names[static_cast<int>(c.schedule) % 5], c.half_c ? ", half_c" : "",
           c.split_slices ? ", split_slices" : "");
}

int fp8_gemm_num_sms() { return num_sms(); }

const char* fp8_gemm_run(const Fp8GemmArgs& g, GemmConfig config, cudaStream_t stream) {
  const int m = g.m, n = g.n, k = g.k;
  if (m <= 0 || n <= 0 || k <= 0 || m % 16 || n % 16 || k % 128)
    return "fp8_gemm: need m, n multiples of 16 and k a multiple of 128";
  if (config.tile_n != 128 && config.tile_n != 64) return "fp8_gemm: config.tile_n must be 64 or 128";
  const bool plain_ws = config.split_slices;
  // The kernel's template flags: schedule in bits 0-2, half-size C staging in bit 3.
  struct {
    int bn, splits, sched;
    bool exact;
  } plan{config.tile_n, config.splits, static_cast<int>(config.schedule) | (config.half_c ? 8 : 0), config.exact};
  if (!(plan.sched >= 0 && plan.sched <= 4) && !(plan.bn == 128 && (plan.sched == 8 || plan.sched == 11)))
    return "fp8_gemm: half_c needs tile_n 128 with the lock_step or split_chains_early schedule";
  if (plan.sched != 0 && !plan.exact) return "fp8_gemm: consumer schedules other than lock_step need the exact path";
  if (!g.a_kmajor && !g.a_t) return "fp8_gemm: column-major A needs the a_t scratch buffer";
  if (!g.b_kmajor && !g.b_t) return "fp8_gemm: column-major B needs the b_t scratch buffer";
  if (plan.exact && (g.a_kmajor || g.b_kmajor))
    return "fp8_gemm: the exact (fp16 MMA) path widens through the transpose pass; pass column-major operands";
  if (g.sa_ld % 4 || (reinterpret_cast<uintptr_t>(g.sa) & 15))
    return "fp8_gemm: a_scale must be M-major with a leading dimension that is a multiple of 4 floats";
  const int sms = num_sms();

  const int splits = ceil_div(k / kBK, ceil_div(k / kBK, plan.splits));
  if (splits > 1 && !g.ws) return "fp8_gemm: split-K plan needs a workspace";

  // Host work (tensor maps, parameters) first and the launches last, back to back, so the GPU does not wait for
  // the host between the transpose pass and the GEMM (on the small shapes the pass takes a few microseconds).
  // 1) K-major copies of the operands that arrive column-major (one launch for both, below); the exact path also
  //    widens them to fp16 there.
  const void* a_km = g.a;
  const void* b_km = g.b;
  TransposeJob ja{g.a, g.a_t, m, k, 0}, jb{g.b, g.b_t, n, k, 0};
  if (!g.a_kmajor) {
    ja.tiles = ceil_div(m, kTrTile) * (k / kTrTile);
    a_km = g.a_t;
  }
  if (!g.b_kmajor) {
    jb.tiles = ceil_div(n, kTrTile) * (k / kTrTile);
    b_km = g.b_t;
  }

  // The split-K memset goes before the transpose pass, so that the GEMM directly follows the kernel it overlaps
  // (PDL). host_cache: both go out before the tensor maps, so the GPU starts while the host makes the rest (the
  // pass takes longer than the maps, so the GEMM's launch still finds it running).
  const auto launch_pass = [&]() {
    if (splits > 1 && !plain_ws) cudaMemsetAsync(g.ws, 0, (size_t)m * n * sizeof(float), stream);
    if (ja.tiles + jb.tiles > 0) {
      if (plan.exact)
        transpose_pair_kernel<true><<<ja.tiles + jb.tiles, kTrThreads, 0, stream>>>(ja, jb);
      else
        transpose_pair_kernel<false><<<ja.tiles + jb.tiles, kTrThreads, 0, stream>>>(ja, jb);
    }
  };
  if (g.host_cache) launch_pass();

  // 2) Tensor maps: operand tiles are 128 bytes of k wide (one swizzle span), scales one k-block tall.
  const CUtensorMapDataType op_type = plan.exact ? CU_TENSOR_MAP_DATA_TYPE_UINT16 : CU_TENSOR_MAP_DATA_TYPE_UINT8;
  const int elem = plan.exact ? 2 : 1;
  CUtensorMap tm_a, tm_b, tm_sa;
  bool ok = make_map(&tm_a, op_type, a_km, k, m, (uint64_t)k * elem, kRowBytes / elem, kBM,
                     CU_TENSOR_MAP_SWIZZLE_128B, g.host_cache);
  ok = ok && make_map(&tm_b, op_type, b_km, k, n, (uint64_t)k * elem, kRowBytes / elem, plan.bn,
                      CU_TENSOR_MAP_SWIZZLE_128B, g.host_cache);
  ok = ok && make_map(&tm_sa, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, g.sa, m, k / 128, (uint64_t)g.sa_ld * 4, kBM, 1,
                      CU_TENSOR_MAP_SWIZZLE_NONE, g.host_cache);
  if (!ok) return "fp8_gemm: cuTensorMapEncodeTiled failed (driver entry point missing or bad alignment)";

  GemmParams p{};
  p.m = m;
  p.n = n;
  p.k = k;
  p.num_m_tiles = ceil_div(m, kBM);
  p.num_n_tiles = ceil_div(n, plan.bn);
  p.num_tiles = p.num_m_tiles * p.num_n_tiles;
  p.num_kb = k / kBK;
  p.kb_per_split = ceil_div(p.num_kb, plan.splits);
  p.splits = ceil_div(p.num_kb, p.kb_per_split);
  p.sb_blocks = ceil_div(n, 128);
  p.num_units = p.num_tiles * p.splits;
  p.sb = g.sb;
  p.sb_s0 = g.sb_s0;
  p.sb_s1 = g.sb_s1;
  p.c = reinterpret_cast<__nv_bfloat16*>(g.c);
  p.ws = g.ws;
  p.ws_split_stride = plain_ws ? (long long)m * n : 0;  // g.ws holds plan.splits >= p.splits slices then

  const int grid = p.num_units < sms ? p.num_units : sms;
  if (!g.host_cache) launch_pass();
  cudaError_t err;
  if (plan.bn == 128 && plan.exact && plan.sched == 8)
    err = launch_gemm<128, true, 8>(grid, stream, tm_a, tm_b, tm_sa, p);
  else if (plan.bn == 128 && plan.exact && plan.sched == 11)
    err = launch_gemm<128, true, 11>(grid, stream, tm_a, tm_b, tm_sa, p);
  else if (plan.bn == 128 && plan.exact && plan.sched == 3)
    err = launch_gemm<128, true, 3>(grid, stream, tm_a, tm_b, tm_sa, p);
  else if (plan.bn == 128 && plan.exact && plan.sched == 4)
    err = launch_gemm<128, true, 4>(grid, stream, tm_a, tm_b, tm_sa, p);
  else if (plan.exact && plan.bn == 64 && plan.sched == 3)
    err = launch_gemm<64, true, 3>(grid, stream, tm_a, tm_b, tm_sa, p);
  else if (plan.exact && plan.bn == 64 && plan.sched == 4)
    err = launch_gemm<64, true, 4>(grid, stream, tm_a, tm_b, tm_sa, p);
  else if (plan.bn == 128 && plan.exact && plan.sched == 1)
    err = launch_gemm<128, true, 1>(grid, stream, tm_a, tm_b, tm_sa, p);
  else if (plan.bn == 128 && plan.exact && plan.sched == 2)
    err = launch_gemm<128, true, 2>(grid, stream, tm_a, tm_b, tm_sa, p);
  else if (plan.bn == 128 && plan.exact)
    err = launch_gemm<128, true>(grid, stream, tm_a, tm_b, tm_sa, p);
  else if (plan.bn == 128)
    err = launch_gemm<128, false>(grid, stream, tm_a, tm_b, tm_sa, p);
  else if (plan.exact && plan.sched == 1)
    err = launch_gemm<64, true, 1>(grid, stream, tm_a, tm_b, tm_sa, p);
  else if (plan.exact && plan.sched == 2)
    err = launch_gemm<64, true, 2>(grid, stream, tm_a, tm_b, tm_sa, p);
  else if (plan.exact)
    err = launch_gemm<64, true>(grid, stream, tm_a, tm_b, tm_sa, p);
  else
    err = launch_gemm<64, false>(grid, stream, tm_a, tm_b, tm_sa, p);

  if (p.splits > 1) {
    const long long count = (long long)m * n;
    if (plain_ws)
      f32_sum_to_bf16_kernel<<<ceil_div(count / 8, 256), 256, 0, stream>>>(g.ws, p.c, count, p.splits);
    else
      f32_to_bf16_kernel<<<ceil_div(count / 8, 256), 256, 0, stream>>>(g.ws, p.c, count);
  }
  if (err == cudaSuccess) err = cudaGetLastError();
  if (err != cudaSuccess) {
    static thread_local char msg[256];
    snprintf(msg, sizeof(msg), "fp8_gemm: launch failed: %s", cudaGetErrorString(err));
    return msg;
  }
  return nullptr;
}
