// The C++ interface between binding.cpp (torch side) and kernel.cu (CUDA side). Plain types only.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

struct Fp8GemmArgs {
  const uint8_t* a;  // e4m3fnuz bytes of A [m, k]: K-contiguous if a_kmajor, else column-major ([k][m] in memory)
  const uint8_t* b;  // e4m3fnuz bytes of B [n, k]: likewise
  bool a_kmajor, b_kmajor;
  uint8_t* a_t;  // [m][k] scratch for the K-major copy of A (unused when a_kmajor)
  uint8_t* b_t;  // [n][k] scratch for B
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
  int promo;   // k32 wgmma steps accumulated on the tensor core before promotion to fp32: 1, 2 or 4
};

// Promotion interval the automatic plan uses (see gemm.cuh: FP8 MMA accumulation precision).
constexpr int kDefaultPromo = 1;

// Configuration for a shape on a GPU with `sms` multiprocessors.
Fp8GemmPlan fp8_gemm_plan(int m, int n, int k, int sms);
int fp8_gemm_num_sms();
// Enqueues the whole computation on `stream`; returns nullptr or a one-line error.
const char* fp8_gemm_run(const Fp8GemmArgs& args, Fp8GemmPlan plan, cudaStream_t stream);
