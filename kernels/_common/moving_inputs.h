// Inputs that move between calls, read by one captured graph through device memory (a "moving" graph).
// Why: leaderboard mode regenerates every input each run, so a graph keyed on the inputs' addresses never replays
// there and the step runs eagerly; mla-decode's eager window launches its attention ~200 us into the call where a
// graph launches it at ~40 (docs/mla-decode-notes.md, findings 50 and 51). A moving graph takes each call's input
// addresses after its launch (late_address.h's ring, a record of kMovingInputs words). Its first kernel
// (moving_take_kernel) writes them to a table in device memory, for kernels that read an input through a plain
// pointer, and rewrites the tensor maps of the inputs (the maps encoded at capture, with the call's address: PTX
// tensormap.replace) into device memory, where the graph's TMA kernels read them (tensormap_acquire first).
//
// Host side: a MovingCapture lives through one capture. Each launch function that reads an input hands it the map it
// encoded (bind) or asks for the input's table word (slot). After the capture, upload() writes the maps and the plan
// into the capture's device buffer (outside any capture: the graph's first launch reads them).
#pragma once
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <stdexcept>

#include "late_address.h"

namespace kb {

constexpr int kMovingInputs = 8;   // addresses a call hands its graph (a record of the late ring)
constexpr int kMovingMaps = 16;    // tensor maps a graph rewrites a call

// What the take kernel does a call, written once after the capture.
struct MovingPlan {
  int maps;                           // bound maps to write
  int input[kMovingMaps];             // the input whose address map i reads from
  long long offset[kMovingMaps];      // bytes past that address
};

// The device buffer of one moving graph (allocated during its capture, so it lives in the graph's memory pool and
// stays as long as the graph): the call's maps, the capture's maps, the call's addresses, the plan.
struct MovingBuffer {
  CUtensorMap bound[kMovingMaps];      // the call's maps (tensormap.replace needs 128-byte alignment: offset 0)
  CUtensorMap templates[kMovingMaps];  // as encoded at capture
  unsigned long long table[kMovingInputs];
  MovingPlan plan;
};
constexpr size_t kMovingBufferBytes = sizeof(MovingBuffer);

// The take kernel's parameters.
struct MovingTake {
  LateAddress ring;     // the call's record: kMovingInputs addresses (take_late_record)
  MovingBuffer* buffer;
};

#ifdef __CUDACC__
// One block of 32 threads, the graph's first kernel: the call's addresses into the table and each bound map
// rewritten from its template, released to the tensormap proxy of the kernels after it.
static __global__ void __launch_bounds__(32) moving_take_kernel(const MovingTake t) {
  __shared__ unsigned long long addresses[kMovingInputs];
  MovingBuffer* b = t.buffer;
  if (threadIdx.x == 0) {
    take_late_record(t.ring, addresses, kMovingInputs);
    for (int i = 0; i < kMovingInputs; ++i) b->table[i] = addresses[i];
  }
  __syncwarp();
  const int i = threadIdx.x;
  if (i < b->plan.maps) {
    const uint4* from = reinterpret_cast<const uint4*>(&b->templates[i]);
    uint4* to = reinterpret_cast<uint4*>(&b->bound[i]);
#pragma unroll
    for (int w = 0; w < 8; ++w) to[w] = from[w];
    const unsigned long long at = reinterpret_cast<unsigned long long>(&b->bound[i]);
    const unsigned long long address = addresses[b->plan.input[i]] + b->plan.offset[i];
    asm volatile("tensormap.replace.tile.global_address.global.b1024.b64 [%0], %1;" ::"l"(at), "l"(address)
                 : "memory");
    asm volatile("fence.proxy.tensormap::generic.release.gpu;" ::: "memory");
  }
  __threadfence();  // the table and maps visible before the next kernel starts (it may read them before its
                    // griddepcontrol.wait: nothing here triggers it early)
}

// Before a TMA kernel's first load through a map the take kernel wrote: its writes seen by the tensormap proxy.
__device__ __forceinline__ void tensormap_acquire(const CUtensorMap* map) {
  asm volatile("fence.proxy.tensormap::generic.acquire.gpu [%0], 128;" ::"l"(reinterpret_cast<uint64_t>(map))
               : "memory");
}
#endif

// One capture's bookkeeping on the host (no CUDA calls but upload's).
class MovingCapture {
 public:
  explicit MovingCapture(void* device_buffer) : dev_(static_cast<MovingBuffer*>(device_buffer)) {
    if (reinterpret_cast<uintptr_t>(device_buffer) % 128) throw std::runtime_error("moving inputs: a misaligned buffer");
    std::memset(&host_, 0, sizeof(host_));
  }

  // map (encoded for this capture) reads input `input` at `offset` bytes past its address: the device address of
  // the call's copy, which the kernel must read instead (after tensormap_acquire).
  const CUtensorMap* bind(const CUtensorMap& map, int input, long long offset = 0) {
    if (input < 0 || input >= kMovingInputs) throw std::runtime_error("moving inputs: no such input");
    const int i = host_.plan.maps;
    if (i == kMovingMaps) throw std::runtime_error("moving inputs: more maps than kMovingMaps");
    host_.templates[i] = map;
    host_.plan.input[i] = input;
    host_.plan.offset[i] = offset;
    ++host_.plan.maps;
    return &dev_->bound[i];
  }

  // The device word holding input `input`'s address in each call (for kernels that read it through a pointer).
  void* const* slot(int input) const {
    if (input < 0 || input >= kMovingInputs) throw std::runtime_error("moving inputs: no such input");
    return reinterpret_cast<void* const*>(&dev_->table[input]);
  }

  MovingTake take(const LateAddress& ring) const { return {ring, dev_}; }

  // The templates and the plan to the device (synchronously; never inside a capture).
  cudaError_t upload() const {
    return cudaMemcpy(&dev_->templates, &host_.templates,
                      sizeof(MovingBuffer) - offsetof(MovingBuffer, templates), cudaMemcpyHostToDevice);
  }

  int maps() const { return host_.plan.maps; }

 private:
  MovingBuffer* dev_;
  MovingBuffer host_;
};

}  // namespace kb
