// Host side of the mla-decode CUDA backend: tensor maps of q and the cache, the split choice, the launches.
// No torch here; binding.cpp owns the tensors.
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <type_traits>
#include <mutex>
#include <tuple>

#include "assemble_q.cuh"
#include "attention.cuh"
#include "attention_s_once.cuh"
#include "attention_seesaw.cuh"
#include "device_sms.h"
#include "head_gemm.cuh"
#include "knobs.h"
#include "launch_error.h"
#include "linear.cuh"
#include "mla_api.h"
#include "tma_host.h"

using namespace mla;

// The s-once kernel for a configuration's compile-time choices.
static auto s_once_kernel(bool rope_first, bool persistent, bool split_release = false) {
  if (persistent) {
    if (!rope_first) return mla_attention_s_once_persistent_kernel<false, false>;
    return split_release ? mla_attention_s_once_persistent_kernel<true, true>
                         : mla_attention_s_once_persistent_kernel<true, false>;
  }
  return rope_first ? mla_attention_s_once_kernel<true> : mla_attention_s_once_kernel<false>;
}

int mla_num_sms() {
  return kb::sm_count_after([] {
    cudaFuncSetAttribute(mla_attention_kernel<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
    cudaFuncSetAttribute(mla_attention_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
    for (const bool rope_first : {false, true})
      for (const bool persistent : {false, true})
        for (const bool split_release : {false, true})
          cudaFuncSetAttribute(s_once_kernel(rope_first, persistent, split_release),
                               cudaFuncAttributeMaxDynamicSharedMemorySize, kSOnceSmemBytes);
    cudaFuncSetAttribute(mla_attention_seesaw_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSeesawSmemBytes);
  });
}

void mla_describe(const MlaConfig& c, char* buf, int size) {
  snprintf(buf, size,
           "MlaConfig{splits=%d, prefetch_tables=%d, s_once=%d, rope_first=%d, seesaw=%d, bulk_store=%d, staged_st=%d, "
           "persistent=%d, narrow_tail=%d, split_release=%d}",
           c.splits, c.prefetch_tables ? 1 : 0, c.s_once ? 1 : 0, c.rope_first ? 1 : 0, c.seesaw ? 1 : 0,
           c.bulk_store ? 1 : 0, c.staged_st ? 1 : 0, c.persistent ? 1 : 0, c.narrow_tail ? 1 : 0,
           c.split_release ? 1 : 0);
}

const char* mla_run(const MlaArgs& a, cudaStream_t stream) {
  if (a.kv_len < 1 || a.kv_len > a.max_seq || a.max_seq % kTile) return "mla cuda: need 1 <= kv_len <= max_seq, max_seq % 64 == 0";
  const int sms = mla_num_sms();
  CUtensorMap tm_q, tm_kv, tm_tail;
  bool ok = kb::make_map_2d(&tm_q, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, a.q, kWidth, (uint64_t)a.bs * kHeads, kWidth * 2,
                            64, kHG, CU_TENSOR_MAP_SWIZZLE_128B) &&
            kb::make_map_2d(&tm_kv, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, a.cache, kWidth, (uint64_t)a.bs * a.max_seq,
                            kWidth * 2, 64, kTile, CU_TENSOR_MAP_SWIZZLE_128B) &&
            kb::make_map_2d(&tm_tail, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, a.cache, kWidth, (uint64_t)a.bs * a.max_seq,
                            kWidth * 2, 64, kTailRows, CU_TENSOR_MAP_SWIZZLE_128B);
  if (!ok) return "mla cuda: cuTensorMapEncodeTiled failed (driver entry point missing or misaligned tensors)";
  Params p{};
  if (a.cache_ref.capture) {  // a moving graph: the call's cache maps, written by its first kernel
    if (!a.config.s_once || a.config.seesaw)
      return "mla cuda: a moving graph's cache maps need the s-once kernel (KBENCH_MLA_S_ONCE=1, KBENCH_MLA_SEESAW=0)";
    p.bound_kv = a.cache_ref.capture->bind(tm_kv, a.cache_ref.input, a.cache_ref.offset);
    p.bound_tail = a.cache_ref.capture->bind(tm_tail, a.cache_ref.input, a.cache_ref.offset);
  }
  p.cos_tab = static_cast<const __nv_bfloat16*>(a.cos_tab);
  p.sin_tab = static_cast<const __nv_bfloat16*>(a.sin_tab);
  p.out = static_cast<__nv_bfloat16*>(a.out);
  p.part_o = a.part_o;
  p.part_ml = a.part_ml;
  p.bs = a.bs;
  p.max_seq = a.max_seq;
  p.kv_len = a.kv_len_dev;
  p.splits = a.config.splits;
  p.bulk_store = a.config.bulk_store && p.splits == 1;
  p.staged_st = a.config.staged_st;
  p.narrow_tail = a.config.narrow_tail && a.config.s_once && !a.config.seesaw;
  p.scale_log2 = static_cast<float>(1.4426950408889634 / std::sqrt(192.0));
#ifdef KBENCH_DEV
  // timing only (benchmarks/mla_decode.py --dev-costs): what the in-kernel RoPE of the keys costs; wrong results
  p.skip_rope = kb::env_int("KBENCH_MLA_DEV_SKIP_ROPE", 0);
  // timing only (--dev-costs): the s-once ring's loads and rotation without the consumers' work; wrong results
  p.skip_math = kb::env_int("KBENCH_MLA_DEV_SKIP_MATH", 0);
  // timing only: the address of an int64 CUDA buffer of kTraceCtas * kTraceRoles * kTraceTiles * kTraceEvents
  // stamps (benchmarks/mla_decode.py --phase-trace allocates it and passes its data_ptr here)
  if (const char* at = std::getenv("KBENCH_MLA_DEV_TRACE"))
    p.trace = reinterpret_cast<long long*>(std::strtoull(at, nullptr, 10));
#endif
  if (p.splits > 1 && (!a.part_o || !a.part_ml)) return "mla cuda: a split plan needs the partial buffers";
  const dim3 grid(kHeadGroups * a.bs * p.splits);
  if (a.config.seesaw) {
    mla_attention_seesaw_kernel<<<grid, kThreads, kSeesawSmemBytes, stream>>>(tm_q, tm_kv, p);
  } else if (a.config.s_once && a.config.persistent && p.splits == 1) {
    const dim3 ctas(std::min<unsigned>(grid.x, static_cast<unsigned>(sms)));  // one an SM, each walking items
    s_once_kernel(a.config.rope_first, true, a.config.split_release)<<<ctas, kThreads, kSOnceSmemBytes, stream>>>(tm_q, tm_kv, tm_tail, p);
  } else if (a.config.s_once) {
    s_once_kernel(a.config.rope_first, false)<<<grid, kThreads, kSOnceSmemBytes, stream>>>(tm_q, tm_kv, tm_tail, p);
  } else {
    const auto kernel = a.config.prefetch_tables ? mla_attention_kernel<true> : mla_attention_kernel<false>;
    kernel<<<grid, kThreads, kSmemBytes, stream>>>(tm_q, tm_kv, p);
  }
  if (p.splits > 1)
    mla_combine_kernel<<<(a.bs * kHeads + 7) / 8, 256, 0, stream>>>(a.part_o, a.part_ml,
                                                                    static_cast<__nv_bfloat16*>(a.out), a.bs,
                                                                    p.splits);
  return kb::launch_error("mla cuda");
}

const char* launch_mla_assemble_q(const void* qn, const void* q, const void* cos_tab, const void* sin_tab, void* q_full,
                                  int bs, int heads, const int* kv_len_dev, int max_seq, cudaStream_t stream) {
  const long long threads = static_cast<long long>(bs) * heads * (qn ? 72 : 8);
  assemble_q_kernel<<<static_cast<int>((threads + kAssembleThreads - 1) / kAssembleThreads), kAssembleThreads, 0,
                      stream>>>(static_cast<const __nv_bfloat16*>(qn), static_cast<const __nv_bfloat16*>(q),
                                static_cast<const __nv_bfloat16*>(cos_tab), static_cast<const __nv_bfloat16*>(sin_tab),
                                static_cast<__nv_bfloat16*>(q_full), bs, heads, kv_len_dev, max_seq);
  return kb::launch_error("mla_assemble_q");
}

const char* launch_mla_append_row(const void* row, void* cache, int bs, int max_seq, const int* kv_len_dev,
                                  const kb::LateAddress& late, cudaStream_t stream, void* const* cache_slot) {
  // one block where it takes the length from the ring: every thread reads it after thread 0 has
  const int blocks = late.ring ? 1 : (bs * 72 + kAssembleThreads - 1) / kAssembleThreads;
  append_row_kernel<<<blocks, kAssembleThreads, 0, stream>>>(static_cast<const uint4*>(row), static_cast<uint4*>(cache),
                                                             bs, max_seq, kv_len_dev, late, cache_slot);
  return kb::launch_error("mla_append_row");
}

const char* launch_moving_take(const kb::MovingTake& take, cudaStream_t stream) {
  kb::moving_take_kernel<<<1, 32, 0, stream>>>(take);
  return kb::launch_error("moving_take");
}

// W_UK's k (128) is two chunks: three stages hold both in flight with two CTAs a SM; W_UV's (512) gets four.
template <bool kBKMajor, int kStages>
static const char* head_gemm_launch(const HeadGemmArgs& p, dim3 grid, cudaStream_t stream) {
  auto kernel = head_gemm_kernel<kBKMajor, kStages>;
  static const cudaError_t attr =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, hg_smem_bytes(kStages));
  if (attr != cudaSuccess) return "mla_head_gemm: cannot raise the kernel's shared memory";
  kernel<<<grid, kHgThreads, hg_smem_bytes(kStages), stream>>>(p);
  return kb::launch_error("mla_head_gemm");
}

const char* launch_mla_head_gemm(const void* a, long long a_row, long long a_head, const void* b, long long b_row,
                                 long long b_head, bool b_k_major, void* c, long long c_row, long long c_head,
                                 int heads, int m, int n, int k, cudaStream_t stream, const void* const* b_slot,
                                 long long b_offset) {
  if (m < 1 || m > kHgBM || n % kHgBN || k % kHgBK || k < kHgBK || heads < 1)
    return "mla_head_gemm: needs 1 <= m <= 128, n a multiple of 128, k a multiple of 64";
  const HeadGemmArgs p{static_cast<const __nv_bfloat16*>(a), a_row, a_head, static_cast<const __nv_bfloat16*>(b),
                       b_row, b_head, static_cast<__nv_bfloat16*>(c), c_row, c_head, m, n, k, b_slot, b_offset};
  const dim3 grid(n / kHgBN, heads);
  const bool deep = k > 2 * kHgBK;
  if (b_k_major) return deep ? head_gemm_launch<true, 4>(p, grid, stream) : head_gemm_launch<true, 3>(p, grid, stream);
  return deep ? head_gemm_launch<false, 4>(p, grid, stream) : head_gemm_launch<false, 3>(p, grid, stream);
}

// ---- the projections (linear.cuh) ------------------------------------------------------------------------------

template <int V>
using Int = std::integral_constant<int, V>;

// Calls f(Int<bn>) for the kernel instance of tile width bn; false if there is none.
template <class F>
static bool with_linear_instance(int bn, F&& f) {
  auto pick = [&](auto bn_c) {
    f(bn_c);
    return true;
  };
  switch (bn) {
    case 256: return pick(Int<256>{});
    case 224: return pick(Int<224>{});
    case 192: return pick(Int<192>{});
    case 128: return pick(Int<128>{});
    case 112: return pick(Int<112>{});
    case 96: return pick(Int<96>{});
    case 64: return pick(Int<64>{});
    case 56: return pick(Int<56>{});
  }
  return false;
}

// The launch of linear_kernel<kBN> with `ctas` CTAs in 1-D clusters of `splits`: attr[0] is set to the cluster
// dimension (numAttrs 1); callers add further attributes after it.
template <int kBN>
static cudaLaunchConfig_t linear_launch_config(int ctas, int splits, cudaLaunchAttribute* attr) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(ctas);
  cfg.blockDim = dim3(kLinearThreads);
  cfg.dynamicSmemBytes = LinearShape<kBN>::kSmemBytes;
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = splits;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cfg;
}

// How many CTAs of the bn-wide kernel in clusters of `splits` the current device holds at once (whole clusters).
static int linear_capacity(int bn, int splits) {
  static std::map<std::tuple<int, int, int>, int> cache;
  static std::mutex mu;
  int dev = 0;
  cudaGetDevice(&dev);
  std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_tuple(dev, bn, splits);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  int ctas = 0;
  with_linear_instance(bn, [&](auto bn_c) {
    constexpr int kBN = decltype(bn_c)::value;
    cudaFuncSetAttribute(linear_kernel<kBN>, cudaFuncAttributeMaxDynamicSharedMemorySize, LinearShape<kBN>::kSmemBytes);
    if constexpr (kBN == kAbsorbNope + kAbsorbRope)  // (the same ring: its absorbing instance holds as many CTAs)
      cudaFuncSetAttribute(linear_kernel<kBN, true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           LinearShape<kBN>::kSmemBytes);
    cudaLaunchAttribute attr[1];
    const cudaLaunchConfig_t cfg = linear_launch_config<kBN>(splits, splits, attr);
    int clusters = 0;
    if (cudaOccupancyMaxActiveClusters(&clusters, linear_kernel<kBN>, &cfg) == cudaSuccess) {
      ctas = clusters * splits;
    } else {
      cudaGetLastError();  // not sticky: this cluster size is just not offered
    }
  });
  cache[key] = ctas;
  return ctas;
}

LinearConfig mla_linear_config(int m, int n, int k) {
  if (m < 1 || m > 128 || n % 4) return LinearConfig{0, 0, false};
  return linear_config(n, k, mla_num_sms(), linear_capacity);
}

LinearConfig mla_linear_pair_config(int m, int n1, int n2, int k) {
  if (m < 1 || m > 128 || n1 % 4 || n2 % 4) return LinearConfig{0, 0, false};
  LinearConfig c = linear_config(n1 + n2, k, mla_num_sms(), linear_capacity);
  // each projection's last tile may be partial: the pair can need a tile more than n1 + n2 does
  if (c.bn && ((n1 + c.bn - 1) / c.bn + (n2 + c.bn - 1) / c.bn) * c.splits > linear_capacity(c.bn, c.splits)) c.bn = 0;
  return c;
}

bool mla_linear_absorbs(const LinearConfig& c, int n) {
  return c.bn == kAbsorbNope + kAbsorbRope && c.splits == 1 && n == 128 * c.bn;
}

const char* launch_mla_linear(const LinearConfig& c, const void* x, const void* w, void* y, int m, int n, int k,
                              cudaStream_t stream, void* const* y_slot, const MovingRef& x_ref, const MovingRef& w_ref,
                              const LinearSecond* second, const LinearAbsorb* absorb) {
  if (m < 1 || m > 128 || k % kLinearBK || n % 4 || c.splits < 1 || (k / kLinearBK) % c.splits ||
      (second && (second->n % 4 || second->n < 1 || y_slot)))
    return "mla_linear: need 1 <= m <= 128, k % 64 == 0, n % 4 == 0 and the k-blocks divisible by the splits";
  if (absorb && (!mla_linear_absorbs(c, n) || second || y_slot))
    return "mla_linear: the W_UK absorption needs bn 192, no split, n = 128 heads x 192, no second projection";
  const char* err = "mla_linear: no kernel for this configuration";
  with_linear_instance(c.bn, [&](auto bn_c) {
    constexpr int kBN = decltype(bn_c)::value;
    CUtensorMap tm_x, tm_w, tm_w2, tm_uk;
    if (!kb::make_map_2d(&tm_x, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, x, k, m, (uint64_t)k * 2, kLinearBK, 128,
                         CU_TENSOR_MAP_SWIZZLE_128B) ||
        !kb::make_map_2d(&tm_w, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, w, k, n, (uint64_t)k * 2, kLinearBK, kBN,
                         CU_TENSOR_MAP_SWIZZLE_128B) ||
        (second && !kb::make_map_2d(&tm_w2, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, second->w, k, second->n,
                                    (uint64_t)k * 2, kLinearBK, kBN, CU_TENSOR_MAP_SWIZZLE_128B))) {
      err = "mla_linear: cuTensorMapEncodeTiled failed (driver entry point missing or misaligned tensors)";
      return;
    }
    if (!second) tm_w2 = tm_w;  // (read by no tile: the kernel takes W2 only past tiles1 of a pair)
    tm_uk = tm_w;                // (read only by kAbsorb)
    if (absorb && !kb::make_map_2d(&tm_uk, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, absorb->w_kv_up, kAbsorbLatent,
                                   128 * kAbsorbHeadRows, (uint64_t)kAbsorbLatent * 2, 64, kAbsorbNope,
                                   CU_TENSOR_MAP_SWIZZLE_128B)) {
      err = "mla_linear: cuTensorMapEncodeTiled failed for W_kv_up";
      return;
    }
    const int tiles1 = (n + kBN - 1) / kBN, tiles2 = second ? (second->n + kBN - 1) / kBN : 0;
    LinearParams p{static_cast<__nv_bfloat16*>(y), y_slot, m, n, k / kLinearBK / c.splits, c.splits, nullptr, nullptr,
                   second ? static_cast<__nv_bfloat16*>(second->y) : nullptr, second ? second->n : 0, tiles1,
                   nullptr};
    // a moving graph: the call's maps of its inputs, written by the graph's first kernel
    if (x_ref.capture) p.bound_x = x_ref.capture->bind(tm_x, x_ref.input, x_ref.offset);
    if (w_ref.capture) p.bound_w = w_ref.capture->bind(tm_w, w_ref.input, w_ref.offset);
    if (second && second->w_ref.capture)
      p.bound_w2 = second->w_ref.capture->bind(tm_w2, second->w_ref.input, second->w_ref.offset);
    if (absorb) {
      p.q_lat = static_cast<__nv_bfloat16*>(absorb->q_lat);
      if (absorb->w_ref.capture) p.bound_uk = absorb->w_ref.capture->bind(tm_uk, absorb->w_ref.input, absorb->w_ref.offset);
    }
    cudaLaunchAttribute attr[2];
    cudaLaunchConfig_t cfg = linear_launch_config<kBN>((tiles1 + tiles2) * c.splits, c.splits, attr);
    cfg.stream = stream;
    // W's first stages load while the previous kernel finishes (the kernel waits for it before reading X)
    attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[1].val.programmaticStreamSerializationAllowed = c.pdl ? 1 : 0;
    cfg.numAttrs = 2;
    if constexpr (kBN == kAbsorbNope + kAbsorbRope) {
      if (absorb) {  // (its shared-memory size set by linear_capacity, as every instance's)
        cudaLaunchKernelEx(&cfg, linear_kernel<kBN, true>, tm_x, tm_w, tm_w2, tm_uk, p);
        err = kb::launch_error("mla_linear (absorbing W_UK)");
        return;
      }
    }
    cudaLaunchKernelEx(&cfg, linear_kernel<kBN>, tm_x, tm_w, tm_w2, tm_uk, p);
    err = kb::launch_error("mla_linear");
  });
  return err;
}
