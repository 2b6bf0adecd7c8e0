// The C++ interface between binding.cpp (torch side) and kernel.cu (CUDA side). Plain types only.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

struct Fp8GemmArgs {
  const uint8_t* a;  // e4m3fnuz bytes of A [m, k]: K-contiguous if a_kmajor, else column-major ([k][m] in memory)
  const uint8_t* b;  // e4m3fnuz bytes of B [n, k]: likewise
  bool a_kmajor, b_kmajor;
  void* a_t;  // [m][k] scratch for the K-major copy of A: bytes, or fp16 for an exact plan (unused when a_kmajor)
  void* b_t;  // [n][k] scratch for B, likewise
  const float* sa;
  long long sa_ld;  // a_scale[i, kb] = sa[kb * sa_ld + i]  (M-major; sa_ld % 4 == 0, 16-byte aligned)
  const float* sb;
  long long sb_s0, sb_s1;  // b_scale[nb, kb] = sb[nb * sb_s0 + kb * sb_s1]
  uint16_t* c;  // bf16 [m][n] row-major, written
  float* ws;    // fp32 [m][n] scratch when plan.splits > 1
  int m, n, k;  // m, n multiples of 16; k multiple of 128
  bool host_cache;  // KBENCH_FP8_HOST_CACHE: the transpose launched before the tensor maps, which come from a cache
};

// Consumer schedules of the exact path, per k-block (gemm.cuh has the details and docs/fp8-mm-notes.md the
// measurements: lock step is the default; the others were correct and slower on the official shapes).
enum class Schedule : int {
  kLockStep = 0,          // both consumer warpgroups issue as soon as the stage is full
  kOrdered = 1,           // consumer 1 issues a block after consumer 0 did
  kAlternating = 2,       // strict ping-pong at k-block granularity
  kSplitChainsEarly = 3,  // the block's two stages in two accumulator chains, the first promoted early
  kSplitChains = 4,       // two accumulator chains promoted together
};

// A named kernel configuration (fp8_gemm_config picks one per shape; KBENCH_PRINT_CONFIG=1 prints it).
struct GemmConfig {
  int tile_n = 128;                       // output tile width: 128 or 64 (tiles are 128 rows)
  int splits = 1;                         // k-splits (1 = no split-K)
  bool exact = true;                      // widen to fp16 and use FP16 wgmma (meets the official tolerance); false:
                                          // FP8 wgmma on the bytes (faster, misses atol on cancelling outputs)
  Schedule schedule = Schedule::kLockStep;
  bool half_c = false;                    // C staged in column halves: one more pipeline stage (tile_n 128)
  bool split_slices = false;              // split-K partials in per-split fp32 slices (plain stores, no atomics)
};

// The configuration for a shape on a GPU with `sms` multiprocessors.
GemmConfig fp8_gemm_config(int m, int n, int k, int sms);
// "GemmConfig{tile_n=128, splits=2, exact, lock_step, split_slices}" into buf (a one-line name for logs).
void fp8_gemm_describe(const GemmConfig& c, char* buf, int size);
int fp8_gemm_num_sms();
// Enqueues the whole computation on `stream`; returns nullptr or a one-line error.
const char* fp8_gemm_run(const Fp8GemmArgs& args, GemmConfig config, cudaStream_t stream);
