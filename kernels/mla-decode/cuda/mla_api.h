// The C++ interface between binding.cpp (torch side) and mla.cu (CUDA side). Plain types only.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "late_address.h"
#include "moving_inputs.h"
#include "linear_config.h"
#include "mla_config.h"

// Where a launch in a moving graph's capture reads one of the step's inputs (moving_inputs.h): the call's address of
// input `input` (binding.cpp's order), `offset` bytes past it. No capture: the address the launch is given.
struct MovingRef {
  kb::MovingCapture* capture = nullptr;
  int input = -1;
  long long offset = 0;
};

// The absorbed attention of one MLA decode step over the latent cache (DeepSeek dims: 128 heads, latent 512 +
// rope 64, fixed by the kernel).
struct MlaArgs {
  const void* q;        // bf16 [bs][128][576]: per head, q_nope absorbed into the latent space (512) | roped q (64)
  const void* cache;    // bf16 [bs][max_seq][576]: latent (512) | un-rotated k_rope (64); rows [0, kv_len) are read
  const void* cos_tab;  // bf16 [max_seq][32]: cos of the reference's bf16 RoPE angles, position x frequency
  const void* sin_tab;  // bf16 [max_seq][32]
  void* out;            // bf16 [bs][128][512]: softmax(q k^T / sqrt(192)) @ latent, written
  float* part_o;        // fp32 [splits][bs][128][512] partial outputs (splits > 1 only)
  float* part_ml;       // fp32 [splits][bs][128][2] running max (log2 domain) and sum (splits > 1 only)
  const int* kv_len_dev;  // int32 [1] in device memory: the rows to read, what the kernels use (a graph replays it)
  int bs, max_seq, kv_len;  // kv_len: the same count on the host, for the checks and the configuration
  MlaConfig config;
  MovingRef cache_ref;  // (the s-once kernels only)
};

int mla_num_sms();
void mla_describe(const MlaConfig& c, char* buf, int size);
const char* mla_run(const MlaArgs& args, cudaStream_t stream);

// The absorbed query in one launch: qn bf16 [heads][bs][512] (q_nope W_UK per
// head), q bf16 [bs][heads][192] (q_nope | un-rotated q_rope), cos/sin bf16 [max_seq][32] -> q_full bf16
// [bs][heads][576] = qn transposed | q_rope with the reference's RoPE at position kv_len - 1, kv_len read from device
// memory (kv_len_dev, int32 [1]); a position outside [0, max_seq) writes NaN rather than reading past the tables.
// qn null: only q_full's rope columns are written (its latent columns already hold qn, written there by the bmm).
const char* launch_mla_assemble_q(const void* qn, const void* q, const void* cos_tab, const void* sin_tab, void* q_full,
                                  int bs, int heads, const int* kv_len_dev, int max_seq, cudaStream_t stream);

// The cache append: cache bf16 [bs][max_seq][576] (16-byte aligned) gets row bf16 [bs][576] at row kv_len - 1 of
// every batch row, kv_len read from device memory (kv_len_dev, int32 [1], 1 <= kv_len <= max_seq: the caller checks).
// late.ring set (a graph only mla_replay launches): the launch first takes its call's output address and cache length
// from the ring, the length into kv_len_dev (late.value_slot). cache_slot set (a moving graph): the cache is at the
// address that device word holds.
const char* launch_mla_append_row(const void* row, void* cache, int bs, int max_seq, const int* kv_len_dev,
                                  const kb::LateAddress& late, cudaStream_t stream, void* const* cache_slot = nullptr);

// A moving graph's first launch (moving_inputs.h): the call's input addresses taken, its maps rewritten.
const char* launch_moving_take(const kb::MovingTake& take, cudaStream_t stream);

// The projections: y bf16 [m][n] = x bf16 [m][k] w bf16 [n][k]^T (row-major, 16-byte aligned), m <= 128.
// mla_linear_config picks the configuration (bn == 0: none fits this shape or GPU; use cuBLAS). y_slot set: y is
// the address the device word y_slot holds when the kernel stores (a late output, late_address.h), not `y`. x_ref,
// w_ref: where x and w are a moving graph's inputs.
// second set: the same launch also stores second->y [m][second->n] = x second->w^T (tiles of c.bn after the first
// projection's; no y_slot then): two projections of one x in one wave (finding 54).
struct LinearSecond {
  const void* w;
  void* y;
  int n;
  MovingRef w_ref;
};
// absorb set (the step's q_up, linear.cuh's kAbsorb: c = {192, 1}, n = 128 * 192): each head's q_nope is also
// multiplied by its W_UK (rows [256 h, 256 h + 128) of w_kv_up bf16 [128 * 256][512]) into q_lat bf16 [m][128][576],
// columns 0 .. 511 of each head (finding 59); y gets only each head's 64 rope columns (all the step reads of it).
struct LinearAbsorb {
  const void* w_kv_up;
  void* q_lat;
  MovingRef w_ref;
};
bool mla_linear_absorbs(const LinearConfig& c, int n);  // whether launch_mla_linear takes `absorb` with c for n
LinearConfig mla_linear_config(int m, int n, int k);
LinearConfig mla_linear_pair_config(int m, int n1, int n2, int k);  // both projections in one wave, or bn 0
const char* launch_mla_linear(const LinearConfig& c, const void* x, const void* w, void* y, int m, int n, int k,
                              cudaStream_t stream, void* const* y_slot = nullptr, const MovingRef& x_ref = {},
                              const MovingRef& w_ref = {}, const LinearSecond* second = nullptr,
                              const LinearAbsorb* absorb = nullptr);

// The per-head GEMMs (head_gemm.cuh): c[h] bf16 [m][n] = a[h] [m][k] . b[h] for h < heads, strides in elements
// (rows of a and c, and b's stored rows: k rows of n, or with b_k_major n rows of k). m <= 128, n % 128 == 0,
// k % 64 == 0, a's and b's rows and heads 16-byte aligned. b_slot set (a moving graph): b is b_offset bytes past the
// address that device word holds.
const char* launch_mla_head_gemm(const void* a, long long a_row, long long a_head, const void* b, long long b_row,
                                 long long b_head, bool b_k_major, void* c, long long c_row, long long c_head,
                                 int heads, int m, int n, int k, cudaStream_t stream, const void* const* b_slot = nullptr,
                                 long long b_offset = 0);
