// The C++ interface between binding.cpp (torch side) and all2all.cu (CUDA side). Plain types only.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

struct A2aArgs {
  uint64_t peers[8];    // every rank's symmetric buffer, mapped into this process (the flags come first)
  int rank, ws, T, K, H, experts_per_rank;
  int M;                // max_num_tokens: rows a source can send a rank
  long long off_count, off_tok, off_x, off_ret;  // byte offsets of the regions in every buffer (layout.py)
  const void* x;        // fp16 [T][H]
  const int* indices;   // int32 [T][K]
  const float* weights;  // fp32 [T][K]
  void* out;            // fp16 [T][H], written
  int* done;            // int32 [2], zero between calls
  uint32_t epoch;       // this call's number (1, 2, ...), the same on every rank
  unsigned long long* trace;  // kA2aTraceWords phase stamps of this call, or nullptr
  int max_blocks;             // a cap on the grid (0: none)
};

// The kernel's phase stamps (the GPU's global timer, ns), written when A2aArgs::trace is set: block 0's start, its
// dispatch rows stored, the dispatch flags released (the last block), block 0 past the peers' dispatch flags, the
// return flags released (the last block), block 0 past the peers' return flags, block 0's end.
constexpr int kA2aTraceWords = 7;

const char* a2a_run(const A2aArgs& args, cudaStream_t stream);
