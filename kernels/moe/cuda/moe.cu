// Host side of the MoE CUDA backend: tensor maps for every expert weight (read in place, no stacking), then
// route -> gather -> grouped GEMM 1 -> grouped GEMM 2 (adding into the output; or writing Y, then the combine: the
// previous path, red_combine off), back to back on one stream. No torch here.
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "device_sms.h"
#include "driver_api.h"
#include "grouped_gemm.cuh"
#include "knobs.h"
#include "launch_error.h"
#include "moe_api.h"
#include "moe_rules.h"
#include "route.cuh"
#include "router.cuh"
#include "tma_host.h"

namespace moe {
namespace {

// 2-D fp16 map over a row-major [rows][cols] array, box_cols x box_rows boxes: 64 columns (128 bytes of a row, one
// 128-byte swizzle span) or 32 (64 bytes, a 64-byte swizzle span: A tiles of a k-32 ring).
// Rows past the end read as zeros (the last m-tile of the shared group). A map's bytes depend only on these
// arguments, so maps are kept by them: the weights of the next call usually sit at the same addresses.
bool map_f16(CUtensorMap* map, const void* ptr, uint64_t cols, uint64_t rows, uint32_t box_rows,
             uint32_t box_cols = 64) {
  return kb::cached_map_2d(map, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, ptr, cols, rows, cols * 2, box_cols, box_rows,
                           box_cols == 64 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_64B);
}

// The grouped GEMM for one use (glu: GEMM 1, else GEMM 2) and ring depth (MoeConfig::stages, 3 or 4): the one
// place that picks an instantiation, for the launches and the shared-memory attribute alike.
// async (MoeConfig::async_epilogue) builds have 3 stages of k 64, or 6 of k 32 (MoeConfig::bk32): the staging buffer
// takes the fourth's room. The consumers' own epilogue has k 64 only (moe_config sees to it).
// (Dev builds: `trace` picks the asynchronous instances that stamp their units, benchmarks/moe.py --trace.)
using GemmKernel = void (*)(GemmParams);
GemmKernel gemm_kernel(bool glu, int stages, bool async, int bk, bool trace = false) {
  constexpr int a32 = Ring<32>::kAsyncStages, a64 = Ring<64>::kAsyncStages;
#ifdef KBENCH_DEV
  if (async && trace && bk == 32)
    return glu ? grouped_gemm_kernel<true, a32, true, true, 32> : grouped_gemm_kernel<false, a32, true, true, 32>;
  if (async && trace)
    return glu ? grouped_gemm_kernel<true, a64, true, true> : grouped_gemm_kernel<false, a64, true, true>;
#endif
  if (async && bk == 32)
    return glu ? grouped_gemm_kernel<true, a32, true, false, 32> : grouped_gemm_kernel<false, a32, true, false, 32>;
  if (async) return glu ? grouped_gemm_kernel<true, a64, true> : grouped_gemm_kernel<false, a64, true>;
  if (stages == 3) return glu ? grouped_gemm_kernel<true, 3> : grouped_gemm_kernel<false, 3>;
  return glu ? grouped_gemm_kernel<true, 4> : grouped_gemm_kernel<false, 4>;
}
int gemm_smem_bytes(int stages, bool async, int bk) {
  if (async) return gemm_smem(bk, bk == 32 ? Ring<32>::kAsyncStages : Ring<64>::kAsyncStages, true).bytes;
  return gemm_smem(64, stages, false).bytes;
}

// The SM count (one CTA an SM), every GEMM instance's shared-memory size set on the device's first call.
int moe_num_sms() {
  return kb::sm_count_after([] {
    for (const int stages : {3, 4})
      for (const bool glu : {false, true})
        for (const bool async : {false, true})
          for (const int bk : {32, 64})
            for (const bool trace : {false, true})
              cudaFuncSetAttribute(gemm_kernel(glu, stages, async, bk, trace),
                                   cudaFuncAttributeMaxDynamicSharedMemorySize, gemm_smem_bytes(stages, async, bk));
  });
}

// The k of launch `launch`'s ring stages (its tensor maps' boxes and its kernel instance), from MoeConfig::bk32's
// bits: the shared expert's GEMM 1 (launches 0 and 3), the routed GEMM 1 (1), GEMM 2 (2).
int launch_bk(const MoeArgs& a, int launch) {
  const int bit = launch == 1 ? 2 : launch == 2 ? 4 : 1;
  return a.bk32 & bit ? 32 : 64;
}

// GEMM 1's parameters that do not depend on which groups a launch takes.
GemmParams gemm1_params(const MoeArgs& a) {
  GemmParams g{};
  g.out = static_cast<__half*>(a.h);
  g.n_out = a.dexp;
  g.n_tiles = a.dexp / 128;
  g.k = a.d;
  g.skip_empty_halves = a.skip_empty_halves;
  g.band = a.band;
  g.decode_ahead = a.decode_ahead;
  return g;
}

// The shared expert's GEMM 1 alone: one group, its meta in the parameters (H rows T*K .. T*K + T - 1).
bool shared_gemm1_params(const MoeArgs& a, GemmParams& g) {
  g = gemm1_params(a);
  const int bk = launch_bk(a, 0);
  if (!map_f16(&g.a[1], a.x, a.d, a.T, kBM, bk) || !map_f16(&g.b[0], a.w_gate[a.E], a.dexp, a.d, bk) ||
      !map_f16(&g.b[kMaxGroups], a.w_up[a.E], a.dexp, a.d, bk))
    return false;
  const int routed_rows = a.T * a.K;  // H keeps the routed rows first, then the shared expert's
  g.groups = g.meta_groups = 1;
  g.shared_group = 0;
  g.fixed_meta[0] = routed_rows;
  g.fixed_meta[1] = routed_rows + a.T;
  g.fixed_meta[2] = 0;
  g.fixed_meta[3] = (a.T + kBM - 1) / kBM;
  return true;
}

// launch: which of the call's GEMM launches this is (0 the shared expert's GEMM 1, 1 the routed GEMM 1, 2 GEMM 2,
// 3 the shared expert's GEMM 1 before the router): its ring's k (launch_bk) and the index of its stamps in a dev
// build's unit trace.
void launch_gemm(GemmParams g, bool glu, const MoeArgs& a, cudaStream_t stream, int launch) {
  const bool async = a.async_epilogue & (glu ? 1 : 2);
  bool trace = false;
#ifdef KBENCH_DEV
  // timing only: the address of an int64 CUDA buffer of kTraceLaunches * kTraceUnits * kTraceFields stamps
  // (benchmarks/moe.py --trace allocates it and passes its data_ptr here; the asynchronous epilogue's units only)
  if (const char* at = std::getenv("KBENCH_MOE_DEV_TRACE")) {
    g.trace = reinterpret_cast<long long*>(std::strtoull(at, nullptr, 10));
    g.trace_launch = launch;
    trace = async && g.trace != nullptr;
  }
#endif
  const int bk = launch_bk(a, launch);
  gemm_kernel(glu, a.stages, async, bk, trace)<<<moe_num_sms(), kThreads, gemm_smem_bytes(a.stages, async, bk),
                                                 stream>>>(g);
}

// router_topk_kernel for E routed experts (<= kMoeMaxRouted = 64), its width ATen's warp softmax's for E: a block
// per kTopkPairs pairs, each block's counts a row of hist ([topk_blocks(T * K)][E]).
void launch_router_topk(const void* logits, int T, int K, int E, void* scores, int64_t* experts, int* hist,
                        kb::LateAddress late, cudaStream_t stream) {
  const auto* in = static_cast<const __half*>(logits);
  auto* out = static_cast<__half*>(scores);
  const int blocks = topk_blocks(T * K);
  int width = 1;
  while (width < E) width *= 2;
  switch (width) {
#define KB_ROUTER_TOPK(w)                                                                                           \
  case w:                                                                                                           \
    router_topk_kernel<w><<<blocks, kRouteThreads, 0, stream>>>(in, T, K, E, out, experts, hist, late);            \
    break;
    KB_ROUTER_TOPK(1) KB_ROUTER_TOPK(2) KB_ROUTER_TOPK(4) KB_ROUTER_TOPK(8) KB_ROUTER_TOPK(16) KB_ROUTER_TOPK(32)
    KB_ROUTER_TOPK(64)
#undef KB_ROUTER_TOPK
  }
}

}  // namespace
}  // namespace moe

using namespace moe;

const char* moe_supported(int T, int K, int E, int d, int dexp) {
  if (E < 1 || E > kMoeMaxRouted) return "moe cuda: 1 to 64 routed experts";
  if (K < 1 || K > E) return "moe cuda: 1 <= experts per token <= experts";
  if (T < 1) return "moe cuda: no tokens";
  if (d % 256 || dexp % 128) return "moe cuda: d_hidden must be a multiple of 256 and d_expert of 128";
  return nullptr;
}

MoeConfig moe_config(int T, int K, int E) {
  const int stages = kb::env_int("KBENCH_MOE_STAGES", 4) == 3 ? 3 : 4;
  const int async_epilogue = kb::env_int("KBENCH_MOE_ASYNC_EPILOGUE", 3) & 3;
  // the gather needs GEMM 1's epilogue warps (async_epilogue bit 0); without them the gather pass runs
  const bool shared_gather = kb::env_int("KBENCH_MOE_SHARED_GATHER", 1) != 0 && (async_epilogue & 1);
  // the gathering launch must follow the routing, so it cannot also go before the router
  const bool shared_first = kb::env_int("KBENCH_MOE_SHARED_FIRST", 1) != 0 && !shared_gather;
  return MoeConfig{moe_skip_empty_halves(T, K, E),
                   kb::env_int("KBENCH_MOE_KEEP_WORKSPACES", 0) != 0, stages,
                   kb::env_int("KBENCH_MOE_RED_COMBINE", 1) != 0, kb::env_int("KBENCH_MOE_SPLIT_ROUTE", 1) != 0,
                   async_epilogue, shared_first, shared_gather, kb::env_int("KBENCH_MOE_GATHER_LSU", 1) != 0,
                   std::max(0, kb::env_int("KBENCH_MOE_BAND", 16)),
                   // k 32 stages only where both GEMMs hand their epilogue over (6 stages beside the staging); the
                   // routed GEMM 1 keeps k 64 (at k 32 it ran at a lower clock, docs/moe-notes.md)
                   async_epilogue == 3 ? kb::env_int("KBENCH_MOE_BK32", 5) & 7 : 0,
                   kb::env_int("KBENCH_MOE_DECODE_AHEAD", 1) != 0,
                   kb::env_int("KBENCH_MOE_LATE_OUTPUT", 1) != 0 && kb::env_int("KBENCH_MOE_RED_COMBINE", 1) != 0 &&
                       kb::env_int("KBENCH_MOE_SPLIT_ROUTE", 1) != 0,
                   kb::env_int("KBENCH_MOE_FUSED_TOPK", 1) != 0 && kb::env_int("KBENCH_MOE_SPLIT_ROUTE", 1) != 0};
}

void moe_describe(const MoeConfig& c, char* buf, int size) {
  snprintf(buf, size,
           "MoeConfig{skip_empty_halves=%d, keep_workspaces=%d, stages=%d, red_combine=%d, split_route=%d, "
           "async_epilogue=%d, shared_first=%d, shared_gather=%d, gather_lsu=%d, band=%d, bk32=%d, "
           "decode_ahead=%d, late_output=%d, fused_topk=%d}",
           c.skip_empty_halves, c.keep_workspaces, c.stages, c.red_combine, c.split_route, c.async_epilogue,
           c.shared_first, c.shared_gather, c.gather_lsu, c.band, c.bk32, c.decode_ahead, c.late_output,
           c.fused_topk);
}

const char* moe_run(const MoeArgs& a, cudaStream_t stream, cudaEvent_t* events) {
  if (const char* why = moe_supported(a.T, a.K, a.E, a.d, a.dexp)) return why;
  const int G = a.E + 1, pairs = a.T * a.K;
  auto mark = [&](int i) {
    if (events) cudaEventRecord(events[i], stream);
  };
  // The routing and the gather launch first; the ~100 tensor maps are made (or found in the cache) while they run.
  mark(0);
  if (a.split_route) {
    const int blocks = route_blocks(pairs);
    int hist_rows = blocks, rows_per_chunk = 1;
    if (a.logits) {  // fused_topk: the router's softmax and top-k count the pairs as they pick them
      hist_rows = topk_blocks(pairs);
      rows_per_chunk = kRouteChunk / kTopkPairs;
      // (the late take in route_place, after the pairs are placed: the host compares the inputs meanwhile)
      launch_router_topk(a.logits, a.T, a.K, a.E, a.scores, a.experts, a.route_hist, kb::LateAddress{}, stream);
    } else {
      route_count_kernel<<<blocks, kRouteThreads, 0, stream>>>(a.experts, pairs, a.E, a.route_hist, a.late);
    }
    route_place_kernel<<<blocks, kRouteThreads, 0, stream>>>(a.experts, a.T, a.K, a.E, a.route_hist, hist_rows,
                                                             rows_per_chunk, a.meta, a.rows_pair, a.pair_row,
                                                             a.logits ? a.late : kb::LateAddress{});
  } else {
    route_kernel<<<1, kRouteThreads, 0, stream>>>(a.experts, a.T, a.K, a.E, a.meta, a.rows_pair, a.pair_row);
  }
  mark(1);
  __half* const* out_slot = reinterpret_cast<__half* const*>(a.out_slot);
  // a graph that takes its output late may be launched before its inputs are checked, and called off by a null
  // address (moe_replay's speculation): every GEMM launch after the take then returns at once
  void* const* abort_slot = a.late.ring ? reinterpret_cast<void* const*>(a.out_slot) : nullptr;
  const bool shared_gather = a.shared_gather && !a.shared_done;
  if (shared_gather) {  // the shared expert's GEMM 1, its epilogue warps gathering xs and zeroing the output
    GemmParams gs;
    if (!shared_gemm1_params(a, gs))
      return "moe cuda: cuTensorMapEncodeTiled failed (driver entry point missing or misaligned weights)";
    gs.gather_x = static_cast<const __half*>(a.x);
    gs.gather_xs = static_cast<__half*>(a.xs);
    gs.gather_pair_row = a.pair_row;
    gs.K = a.K;
    gs.zero_slot = out_slot;
    gs.gather_lsu = a.gather_lsu && a.K <= 32;  // its lanes hold a token's K rows
    gs.abort_slot = abort_slot;
    launch_gemm(gs, true, a, stream, 0);
  } else {
    gather_kernel<<<a.T, 256, 0, stream>>>(static_cast<const __half*>(a.x), a.pair_row, static_cast<__half*>(a.xs),
                                          a.K, a.d, out_slot);
  }
  mark(2);
  // shared_done (moe_run_shared_gemm1 ran before the router) or shared_gather (just above): this GEMM 1 takes the
  // routed groups of the meta only
  const bool shared_ran = a.shared_done || shared_gather;
  const int G1 = shared_ran ? a.E : G;
  GemmParams g1 = gemm1_params(a), g2{};
  const int bk1 = launch_bk(a, 1), bk2 = launch_bk(a, 2);
  bool ok = map_f16(&g1.a[0], a.xs, a.d, pairs, kBM, bk1) && map_f16(&g1.a[1], a.x, a.d, a.T, kBM, bk1) &&
            map_f16(&g2.a[0], a.h, a.dexp, pairs + a.T, kBM, bk2);
  for (int g = 0; ok && g < G; ++g) {
    ok = (g >= G1 || (map_f16(&g1.b[g], a.w_gate[g], a.dexp, a.d, bk1) &&
                      map_f16(&g1.b[kMaxGroups + g], a.w_up[g], a.dexp, a.d, bk1))) &&
         map_f16(&g2.b[g], a.w_down[g], a.d, a.dexp, bk2);
  }
  if (!ok) return "moe cuda: cuTensorMapEncodeTiled failed (driver entry point missing or misaligned weights)";
  g1.meta = g2.meta = a.meta;
  g1.meta_groups = g2.meta_groups = G;
  g1.groups = G1;
  g2.groups = G;
  g1.shared_group = shared_ran ? -1 : a.E;
  g2.shared_group = a.E;
  g2.out = static_cast<__half*>(a.y);
  g2.out_rows = a.rows_pair;
  g2.n_out = a.d;
  g2.n_tiles = a.d / 256;
  g2.k = a.dexp;
  g2.shared_out_row0 = pairs;
  g2.out_slot = out_slot;  // red_combine: GEMM 2 adds into the output the gather zeroed; Y is not used
  g2.scores = static_cast<const __half*>(a.scores);
  g2.K = a.K;
  g2.skip_empty_halves = a.skip_empty_halves;
  g2.band = a.band;
  g2.decode_ahead = a.decode_ahead;
  g1.abort_slot = g2.abort_slot = abort_slot;
  launch_gemm(g1, true, a, stream, 1);
  mark(3);
  launch_gemm(g2, false, a, stream, 2);
  mark(4);
  if (a.out && !out_slot) moe_run_combine(a.y, a.scores, a.out, a.T, a.K, a.d, stream);
  mark(5);
  return kb::launch_error("moe cuda");
}

const char* moe_run_shared_gemm1(const MoeArgs& a, cudaStream_t stream) {
  if (const char* why = moe_supported(a.T, a.K, a.E, a.d, a.dexp)) return why;
  GemmParams g;
  if (!shared_gemm1_params(a, g))
    return "moe cuda: cuTensorMapEncodeTiled failed (driver entry point missing or misaligned weights)";
  launch_gemm(g, true, a, stream, 3);
  return kb::launch_error("moe cuda shared GEMM 1");
}

const char* moe_run_combine(const void* y, const void* scores, void* out, int T, int K, int d, cudaStream_t stream) {
  const long long chunks = static_cast<long long>(T) * (d / 8);
  combine_kernel<<<static_cast<int>((chunks + 255) / 256), 256, 0, stream>>>(
      static_cast<const __half*>(y), static_cast<const __half*>(scores), static_cast<__half*>(out), T, K, d);
  return kb::launch_error("moe cuda combine");
}

// (router_topk_kernel's rows, a whole number of them a routing chunk: never fewer than route_count_kernel's)
int moe_route_hist_rows(int pairs) { return topk_blocks(pairs); }

const char* moe_run_router_topk(const void* logits, int T, int K, int E, void* scores, int64_t* experts,
                                int* hist, cudaStream_t stream) {
  if (E < 1 || E > kMoeMaxRouted || K < 1 || K > E || T < 1) return "moe_router_topk: 1 <= K <= E <= 64, T >= 1";
  launch_router_topk(logits, T, K, E, scores, experts, hist, kb::LateAddress{}, stream);
  return kb::launch_error("moe cuda router top-k");
}

// The address goes in by the stream's own 64-bit write (driver_api.h: no kernel to launch, which the host pays ~5-12
// us for at the start of an official call; docs/moe-notes.md, thirtieth session); by publish_kernel where the driver
// has no such write, or with KBENCH_MOE_PUBLISH_KERNEL=1 (the build before, candidate `publish-kernel`).
const char* moe_publish_output(void** slot, void* out, cudaStream_t stream) {
  if (!kb::env_int("KBENCH_MOE_PUBLISH_KERNEL", 0) &&
      kb::stream_write(stream, slot, reinterpret_cast<uint64_t>(out)))
    return nullptr;
  publish_kernel<<<1, 1, 0, stream>>>(slot, out);
  return kb::launch_error("moe cuda publish");
}
