// Flags between GPUs of one host for the distributed backends: epoch-stamped uint32 flags in symmetric memory
// (torch.distributed's symmetric memory maps every rank's buffer into every rank's address space). A rank announces
// "my data for you is complete" by storing the call's epoch into the receiver's flag for it (release, system
// scope); the receiver spins until the flag has reached that epoch (acquire). Epochs only grow, so flags are never
// reset, and a sender is at most one epoch ahead of a receiver that has not yet read its flag.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "device_sms.h"  // kb::sm_count: the host sizes the peer kernels' grids by it
#include "sm90.cuh"

namespace kb {

constexpr int kMaxRanks = 8;

struct PeerPtrs {
  uint64_t p[kMaxRanks];  // rank r's buffer, mapped into this process
};

// Lane i < count stores `epoch` at word `word` of peers.p[i]'s buffer (whatever that rank waits on). Launched after
// the work whose results the flag announces, on the same stream.
__global__ void signal_peers_kernel(const __grid_constant__ PeerPtrs peers, int count, int word, uint32_t epoch) {
  const int i = threadIdx.x;
  if (i < count) {
    __threadfence_system();
    sm90::st_release_sys(reinterpret_cast<uint32_t*>(peers.p[i]) + word, epoch);
  }
}

// The last block of a grid to get here (a ticket on `counter`, a zeroed device int it leaves at zero) runs `last`
// (its first thread only), after a system fence in every block: whatever `last` announces to a peer includes every
// block's stores before it. Every thread of every block calls it.
template <class F>
__device__ __forceinline__ void when_last(int* counter, F last) {
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence_system();
    if (atomicAdd(counter, 1) == static_cast<int>(gridDim.x) - 1) {
      last();
      *counter = 0;
    }
  }
}

// when_last storing `epoch` at flag word `word` of each of the `count` buffers `bufs`, with a system-scope release:
// a receiver that sees the flag sees every block's stores before it.
__device__ __forceinline__ void flag_when_last(const PeerPtrs& bufs, int count, int word, uint32_t epoch,
                                               int* counter) {
  when_last(counter, [&] {
    for (int r = 0; r < count; ++r) sm90::st_release_sys(reinterpret_cast<uint32_t*>(bufs.p[r]) + word, epoch);
  });
}

// Lane i < count spins until flags[first + i] has reached epoch; the kernels after it on the stream see what the flags
// announced.
__global__ void wait_flags_kernel(const uint32_t* flags, int first, int count, uint32_t epoch) {
  const int i = threadIdx.x;
  if (i < count) sm90::wait_flag_sys(flags + first + i, epoch);
  __syncthreads();
  __threadfence_system();
}

}  // namespace kb
