// The C++ interface between binding.cpp (torch side) and moe.cu (CUDA side). Plain types only.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "late_address.h"

constexpr int kMoeMaxRouted = 64;  // routed experts the kernels take (the shared expert is one more group)

struct MoeArgs {
  const void* x;          // fp16 [T][d] tokens
  int64_t* experts;       // [T][K] chosen expert ids (torch.topk indices); written by moe_run where logits is set
  void* scores;           // fp16 [T][K] router scores of the chosen experts; written by moe_run where logits is set
  const void* logits;     // fp16 [T][E] router logits (MoeConfig::fused_topk: moe_run's first launch picks experts
                          // and scores from them as torch.topk(softmax) does, and counts the routing's pairs);
                          // nullptr: experts and scores are given
  const void* w_gate[kMoeMaxRouted + 1];  // fp16 [d][dexp] per group (routed experts, then the shared one)
  const void* w_up[kMoeMaxRouted + 1];    // fp16 [d][dexp]
  const void* w_down[kMoeMaxRouted + 1];  // fp16 [dexp][d]
  int T, K, E, d, dexp;
  // workspaces (device memory, sized by moe_workspace_bytes)
  int* meta;          // [2 * (E + 2)]: group row offsets, then m-tile offsets
  int* rows_pair;     // [T*K] pair index t*K + k of each expert-sorted row (the row of Y it lands in)
  int* pair_row;      // [T*K] the inverse: the sorted row of pair t*K + k
  void* xs;           // fp16 [T*K][d]: the routed rows gathered in expert order
  void* h;            // fp16 [T*K + T][dexp]: silu(gate) * up, routed rows then the shared expert's
  void* y;            // fp16 [T*K + T][d]: expert outputs, pair order, then the shared expert's (unused with
                      // out_slot)
  void* out;          // fp16 [T][d], written; nullptr: stop after GEMM 2 (Y holds the result, moe_run_combine)
  // MoeConfig::red_combine: the device address of the output's pointer (moe_publish_output wrote it). The gather
  // zeroes *out_slot's rows and GEMM 2 adds each expert's scored rows into them (no Y, no combine); out unused.
  void* const* out_slot;
  int skip_empty_halves;  // MoeConfig::skip_empty_halves
  int stages;             // MoeConfig::stages
  int split_route;        // MoeConfig::split_route
  int async_epilogue;     // MoeConfig::async_epilogue
  int shared_done;        // moe_run_shared_gemm1 already wrote the shared expert's H rows: GEMM 1 takes the routed
                          // experts only
  int* route_hist;        // split_route: [moe_route_hist_rows(T*K)][E] per-block expert counts
  int shared_gather;      // MoeConfig::shared_gather: moe_run launches the shared expert's GEMM 1 after the routing,
                          // and that launch gathers xs and zeroes the output (no gather pass)
  int gather_lsu;         // MoeConfig::gather_lsu
  int band;               // MoeConfig::band
  int bk32;               // MoeConfig::bk32
  int decode_ahead;       // MoeConfig::decode_ahead
  // MoeConfig::late_output, in a graph's capture only: the routing's first launch takes the output's address from the
  // host after the launch (late_address.h) and writes it to *out_slot; a null ring: out_slot already holds it
  kb::LateAddress late;
};

// A named configuration (KBENCH_PRINT_CONFIG=1 prints the one picked for each shape). The defaults are the measured
// build; the knobs KBENCH_MOE_SKIP_EMPTY_HALVES=1, KBENCH_MOE_KEEP_WORKSPACES=1 and KBENCH_MOE_STAGES=3 turn on
// candidates that benchmarks/moe.py times beside it; KBENCH_MOE_ASYNC_EPILOGUE=0/1/2 (the consumers' own epilogue in
// both GEMMs, in GEMM 2, in GEMM 1), KBENCH_MOE_RED_COMBINE=0 and KBENCH_MOE_SPLIT_ROUTE=0 bring back earlier builds'
// epilogue, combine pass and one-block routing; KBENCH_MOE_SHARED_FIRST=0 moe_layer's GEMM 1 in one launch after the
// router, as before (docs/moe-notes.md).
struct MoeConfig {
  bool skip_empty_halves;  // GEMM consumers with no rows in the last m-tile of a group issue no MMAs (by default
                           // where routed experts average <= 512 rows; KBENCH_MOE_SKIP_EMPTY_HALVES=0/1 off/on)
  bool keep_workspaces;    // the gather, H and Y workspaces stay allocated across calls of one shape
  int stages;              // the synchronous-epilogue GEMMs' shared-memory ring: 4 or 3 stages (KBENCH_MOE_STAGES)
  bool red_combine;        // GEMM 2's epilogue adds score * expert output into the zeroed output (fp16 red.add)
  bool split_route;        // the routing sort in two launches of many blocks instead of one block
  int async_epilogue;      // bit 0: GEMM 1, bit 1: GEMM 2 hand their epilogue to the producer warpgroup's idle warps
                           // (3 stages; KBENCH_MOE_ASYNC_EPILOGUE)
  bool shared_first;       // moe_layer launches the shared expert's GEMM 1 before the router (it needs only x), so
                           // the GPU works while the host routes (KBENCH_MOE_SHARED_FIRST; off with shared_gather)
  bool shared_gather;      // the shared expert's GEMM 1 runs after the routing, its epilogue warps doing the gather
                           // pass's copies and zeroing under its MMAs (KBENCH_MOE_SHARED_GATHER; off where GEMM 1
                           // has no asynchronous epilogue, whose warps do it; takes precedence over shared_first)
  bool gather_lsu;         // shared_gather's copies through the load/store units (cp.async in, 16-byte stores out)
                           // instead of bulk copies through the TMA unit (KBENCH_MOE_GATHER_LSU; on since the
                           // twenty-fourth session)
  int band;                // the GEMMs walk a group of more m-tiles than this in bands of this many (KBENCH_MOE_BAND,
                           // 16 since the twenty-fourth session; 0: n-tile by n-tile over the whole group)
  int bk32;                // the launches whose ring stages hold k 32 (6 stages of 24 KB: more bytes in flight while
                           // the consumers hold one) instead of 64 (3 of 48 KB): bit 0 the shared expert's GEMM 1,
                           // bit 1 the routed GEMM 1, bit 2 GEMM 2 (KBENCH_MOE_BK32; both epilogues asynchronous only;
                           // 5 since the twenty-fifth session, 0 the build before)
  bool decode_ahead;       // the GEMM consumers decode their next unit under the current one's last MMAs, every role's
                           // scan for a unit's group from the previous unit's (KBENCH_MOE_DECODE_AHEAD; on since the
                           // twenty-seventh session, 0 the build before)
  bool late_output;        // graphs the binding launches itself take the output's address from the host after their
                           // launch (late_address.h), so the host makes the output while the GPU routes
                           // (KBENCH_MOE_LATE_OUTPUT; with split_route and red_combine only; 0 the build before)
  bool fused_topk;         // moe_layer's softmax, top-k and the routing's counts in one launch (router.cuh) instead
                           // of ATen's softmax and topk and route_count_kernel (KBENCH_MOE_FUSED_TOPK; with
                           // split_route only; on since the forty-seventh session, 0 the build before)
};
MoeConfig moe_config(int T, int K, int E);
void moe_describe(const MoeConfig& c, char* buf, int size);

// Checks the shapes the kernels take; nullptr or a one-line reason.
const char* moe_supported(int T, int K, int E, int d, int dexp);
// Enqueues route -> gather -> GEMM 1 (gate|up, SiLU*up) -> GEMM 2 (down; with out_slot it adds score x output into
// the output, else it scatters to Y and the combine follows when out is set) on `stream`.
// events (optional, for benchmarks): 6 events recorded before, between and after the five stages (the combine's
// span is empty with out_slot).
const char* moe_run(const MoeArgs& args, cudaStream_t stream, cudaEvent_t* events = nullptr);
// GEMM 1 of the shared expert alone (its H rows T*K .. T*K + T - 1), from x, w_gate[E], w_up[E] and h; the other
// fields as moe_run takes them. moe_run with shared_done then skips that group. (With shared_gather moe_run makes
// this launch itself, after the routing.)
const char* moe_run_shared_gemm1(const MoeArgs& args, cudaStream_t stream);
// Rows of MoeArgs::route_hist for `pairs` (token, slot) pairs (the routing's per-block counts, either launch's).
int moe_route_hist_rows(int pairs);
// router.cuh alone (tests): scores [T][K] fp16 and experts [T][K] int64 = torch.topk(logits.softmax(-1), K,
// sorted=False) for logits [T][E] fp16, contiguous; hist [moe_route_hist_rows(T*K)][E] int32 scratch.
const char* moe_run_router_topk(const void* logits, int T, int K, int E, void* scores, int64_t* experts,
                                int* hist, cudaStream_t stream);
// Writes `out`'s address to the device word `slot` on `stream` (the red_combine path reads it there, so one captured
// graph serves a new output tensor every call).
const char* moe_publish_output(void** slot, void* out, cudaStream_t stream);
// The combine alone: out [T][d] = y's shared row T*K + t + sum_k scores[t][k] * y's row t*K + k (fp16 in and out).
const char* moe_run_combine(const void* y, const void* scores, void* out, int T, int K, int d, cudaStream_t stream);
