// The C++ interface between binding.cpp (torch side) and moe.cu (CUDA side). Plain types only.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

constexpr int kMoeMaxRouted = 64;  // routed experts the kernels take (the shared expert is one more group)

struct MoeArgs {
  const void* x;          // fp16 [T][d] tokens
  const int64_t* experts;  // [T][K] chosen expert ids (torch.topk indices)
  const void* scores;     // fp16 [T][K] router scores of the chosen experts
  const void* w_gate[kMoeMaxRouted + 1];  // fp16 [d][dexp] per group (routed experts, then the shared one)
  const void* w_up[kMoeMaxRouted + 1];    // fp16 [d][dexp]
  const void* w_down[kMoeMaxRouted + 1];  // fp16 [dexp][d]
  int T, K, E, d, dexp;
  // workspaces (device memory, sized by moe_workspace_bytes)
  int* meta;          // [2 * (E + 2)]: group row offsets, then m-tile offsets
  int* rows_token;    // [T*K] token of each expert-sorted (token, slot) pair
  int* rows_pair;     // [T*K] its pair index t*K + k (the row of Y it lands in)
  void* xs;           // fp16 [T*K][d]: the routed rows gathered in expert order
  void* h;            // fp16 [T*K + T][dexp]: silu(gate) * up, routed rows then the shared expert's
  void* y;            // fp16 [T*K + T][d]: expert outputs, pair order, then the shared expert's
  void* out;          // fp16 [T][d], written
};

// Checks the shapes the kernels take; nullptr or a one-line reason.
const char* moe_supported(int T, int K, int E, int d, int dexp);
// Enqueues route -> gather -> GEMM 1 (gate|up, SiLU*up) -> GEMM 2 (down, scatter) -> combine on `stream`.
// events (optional, for benchmarks): 6 events recorded before, between and after the five stages.
const char* moe_run(const MoeArgs& args, cudaStream_t stream, cudaEvent_t* events = nullptr);
