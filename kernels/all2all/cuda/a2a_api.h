// The C++ interface between binding.cpp (torch side) and all2all.cu (CUDA side). Plain types only.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

struct A2aArgs {
  uint64_t peers[8];   // every rank's symmetric buffer, mapped into this process (the flags come first)
  int rank, ws, T, K, H, experts_per_rank, P;
  long long off_count, off_pair, off_x, off_ret;  // byte offsets of the regions in every buffer (a2a_layout)
  const void* x;        // fp16 [T][H]
  const int* indices;   // int32 [T][K]
  const float* weights;  // fp32 [T][K]
  void* out;            // fp16 [T][H], written
  int* slot;            // int32 [T*K] scratch
  int* done;            // int32 [2], zero between calls
  uint32_t epoch;       // this call's number (1, 2, ...), the same on every rank
};

const char* a2a_run(const A2aArgs& args, cudaStream_t stream);
