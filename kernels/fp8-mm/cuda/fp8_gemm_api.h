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
};

struct Fp8GemmPlan {
  int bn;      // tile width: 128 or 64
  int splits;  // k-splits (1 = no split-K)
  bool exact;  // true: widen to fp16 and use FP16 wgmma (meets the official tolerance; needs column-major A, B);
               // false: FP8 wgmma on the bytes (faster, misses atol on nearly cancelling outputs; gemm.cuh)
  int sched = 0;  // exact path: consumer schedule (gemm.cuh: 0 lock step, 1 ordered, 2 alternating, 3/4 split chains)
};

// Configuration for a shape on a GPU with `sms` multiprocessors.
Fp8GemmPlan fp8_gemm_plan(int m, int n, int k, int sms);
int fp8_gemm_num_sms();
// Enqueues the whole computation on `stream`; returns nullptr or a one-line error.
const char* fp8_gemm_run(const Fp8GemmArgs& args, Fp8GemmPlan plan, cudaStream_t stream);
