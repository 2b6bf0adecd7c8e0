// Host entry points of peer_ops.cu (plain types, for the binding files of the distributed backends).
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

// Store `epoch` at word `word` of each of the `count` buffers `peers` (after the stream's earlier work).
const char* peer_signal(const uint64_t* peers, int count, int word, uint32_t epoch, cudaStream_t stream);
// Hold the stream until flags[first .. first + count) all reach `epoch`.
const char* peer_wait(const uint32_t* flags, int first, int count, uint32_t epoch, cudaStream_t stream);
// out = bf16(sum of the `count` bf16 arrays `srcs`, in that order, fp32 accumulation); first waits for this
// rank's flags [0, count) to reach `epoch`. elems % 8 == 0.
const char* peer_sum_rows(const uint64_t* srcs, int count, void* out, long long elems, const uint32_t* flags,
                          uint32_t epoch, cudaStream_t stream);
// Copy `bytes` from src to byte `offset` of each of the `count` buffers `dsts` by SM stores, then store `epoch` at
// word `word` of each (one launch of at most max_blocks blocks where > 0; counter: a zeroed device int, left zeroed).
// bytes, offset, src: multiples of 16.
const char* peer_push(const uint64_t* dsts, int count, const void* src, long long offset, long long bytes, int word,
                      uint32_t epoch, int* counter, int max_blocks, cudaStream_t stream);
