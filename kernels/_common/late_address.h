// An address the host decides after it has launched the graph that uses it (a new output tensor).
// Why: a host-timed call pays every host step before its graph launch, since the GPU is idle until then. Making the
// output (torch::empty) and writing its address into device memory by a stream write cost 13-20 us of host time
// right after the official timer's synchronize (docs/moe-notes.md, thirty-second session). Here the graph launches
// first. The host then makes the output and stores its address in mapped host memory. A kernel early in the graph
// (long before anything writes the output) waits for that store and copies the address to the device word the later
// kernels read.
//
// A call may also hand the graph a 32-bit value it knew before the launch (mla-decode's cache length): publishing it
// with the address spares the host a stream write, a driver call of its own, before the launch.
//
// Call s (counted from 1 on each device) takes ring word s % kLateRing, tagged with the low 16 bits of s. The device
// counts the calls it took in `taken`, so a graph launched for call s takes call s's address even while the host has
// gone on to later calls. Every launch of a graph that takes an address must be paired with exactly one publish(),
// in launch order, on one stream; eager calls take nothing.
#pragma once
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <thread>

namespace kb {

constexpr unsigned long long kLateRing = 64;  // calls the host may run ahead of the GPU before publish() waits
constexpr unsigned long long kLateAddressBits = 48;
constexpr unsigned long long kLateAddressMask = (1ull << kLateAddressBits) - 1;

// What a kernel needs to take its call's address. A null ring: nothing to take (eager calls, older builds).
struct LateAddress {
  const unsigned long long* ring = nullptr;  // mapped host memory [words * kLateRing]: word j of call s at
                                             // [j * kLateRing + s % kLateRing]; word 0 (s & 0xffff) << 48 | address,
                                             // word 1 the call's value (publish), or a longer record
  unsigned long long* taken = nullptr;       // device memory: how many calls the device took an address for
  unsigned long long* taken_host = nullptr;  // mapped host memory: taken's copy, read by publish()
  unsigned long long* waited_host = nullptr;  // mapped host memory: the ns the last take waited from its first read
                                              // of the ring (a benchmark's figure: how long the GPU waited)
  void** slot = nullptr;                     // device memory: where the later kernels read the address
  unsigned* value_slot = nullptr;            // device memory: where they read the call's value (null: none taken)
};

#ifdef __CUDACC__
// One thread: wait for the next call's record of n words (publish_record on a ring of at least n words), write them
// to out[0, n) (word 0 without its tag) and count the call taken. Word 0 is read with acquire where more words
// follow it (the host stores them first). Traps after 2 s without it (a launch the host never published for), so
// that a mismatch fails loudly instead of hanging.
__device__ inline void take_late_record(const LateAddress& l, unsigned long long* out, int n) {
  const unsigned long long s = *l.taken + 1;
  const unsigned long long tag = (s & 0xffffull) << kLateAddressBits;
  const unsigned long long* at = l.ring + s % kLateRing;
  unsigned long long word, t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  for (;;) {
    if (n > 1)
      asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(word) : "l"(at) : "memory");
    else
      asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(word) : "l"(at) : "memory");
    if ((word & ~kLateAddressMask) == tag) break;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    if (t - t0 > 2000000000ull) {
      printf("kbench: call %llu's late address never arrived (a graph launched without its publish)\n", s);
      __trap();
    }
    __nanosleep(256);
  }
  out[0] = word & kLateAddressMask;
  for (int j = 1; j < n; ++j)
    asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(out[j]) : "l"(at + j * kLateRing) : "memory");
  *l.taken = s;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  asm volatile("st.relaxed.sys.global.u64 [%0], %1;" ::"l"(l.waited_host), "l"(t - t0) : "memory");
  // Release: the reads of words 1.. above are performed before the host may see the record's words as free (a
  // relaxed store here let them fall behind it: the host, waiting on a full ring, then wrote call s + kLateRing's
  // value into word 1 while this read was still in flight, and the call took a length 64 calls later's; the late
  // test's 150-call backlog caught it on an H200).
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(l.taken_host), "l"(s) : "memory");
}

// One thread: wait for the next call's address, then write it to l.slot (and its value to l.value_slot).
__device__ inline void take_late_address(const LateAddress& l) {
  unsigned long long record[2];
  take_late_record(l, record, l.value_slot ? 2 : 1);
  *l.slot = reinterpret_cast<void*>(record[0]);
  if (l.value_slot) *l.value_slot = static_cast<unsigned>(record[1]);
}
#endif

// The host side, one a device (made on that device, never freed: captured graphs hold its addresses).
class LateAddressRing {
 public:
  // slot: the device word the kernels read the address from; taken: a zeroed device word of 8 bytes (both on the
  // device this ring serves, allocated by the caller outside any stream capture); words: a call's record (an address
  // and a value; more for publish_record).
  LateAddressRing(void** slot, unsigned long long* taken, int words = 2) : slot_(slot), taken_(taken), words_(words) {
    void* ring = nullptr;
    void* host = nullptr;
    if (words < 2 ||
        cudaHostAlloc(&ring, words * kLateRing * 8, cudaHostAllocMapped | cudaHostAllocPortable) != cudaSuccess ||
        cudaHostAlloc(&host, 16, cudaHostAllocMapped | cudaHostAllocPortable) != cudaSuccess)
      throw std::runtime_error("late address: no mapped host memory (cudaHostAlloc failed)");
    ring_ = static_cast<unsigned long long*>(ring);
    taken_host_ = static_cast<unsigned long long*>(host);
    waited_host_ = taken_host_ + 1;
    for (unsigned long long i = 0; i < words * kLateRing; ++i) ring_[i] = 0;  // tag 0: call 0, which never comes
    *taken_host_ = *waited_host_ = 0;
  }

  // value_slot: where the graph's kernels read the value publish() hands them (null: they take none).
  LateAddress view(unsigned* value_slot = nullptr) const {
    return {ring_, taken_, taken_host_, waited_host_, slot_, value_slot};
  }

  // The us the GPU's last take waited for its address (from its first read of the ring: at least one read across
  // PCIe, ~1-2 us), as far as the GPU has got.
  double last_wait_us() const { return __atomic_load_n(waited_host_, __ATOMIC_ACQUIRE) / 1e3; }

  // Call s's address and value (s = the calls published so far + 1): the graph launched last. Waits while the GPU
  // has not yet taken call s - kLateRing's address (the words s reuses); throws after 10 s of that.
  void publish(const void* address, unsigned value = 0) {
    const unsigned long long record[2] = {reinterpret_cast<unsigned long long>(address), value};
    publish_record(record, 2);
  }

  // Call s's record of n <= words values (take_late_record): record[0] an address (below 2^48: it carries the tag),
  // the rest any values; stored last to first, word 0 with release.
  void publish_record(const unsigned long long* record, int n) {
    if (n < 1 || n > words_) throw std::runtime_error("late address: a record longer than the ring's");
    if (record[0] & ~kLateAddressMask) throw std::runtime_error("late address: an address above 2^48");
    const unsigned long long s = issued_ + 1;
    const auto start = std::chrono::steady_clock::now();
    while (s > __atomic_load_n(taken_host_, __ATOMIC_ACQUIRE) + kLateRing) {
      if (std::chrono::steady_clock::now() - start > std::chrono::seconds(10))
        throw std::runtime_error("late address: the GPU took no output address for 10 s");
      std::this_thread::yield();
    }
    for (int j = n - 1; j >= 1; --j) __atomic_store_n(&ring_[j * kLateRing + s % kLateRing], record[j], __ATOMIC_RELAXED);
    __atomic_store_n(&ring_[s % kLateRing], ((s & 0xffffull) << kLateAddressBits) | record[0], __ATOMIC_RELEASE);
    issued_ = s;
  }

 private:
  void** slot_;
  unsigned long long* taken_;
  unsigned long long* ring_ = nullptr;
  unsigned long long* taken_host_ = nullptr;
  unsigned long long* waited_host_ = nullptr;  // (taken_host_'s allocation, its second word)
  int words_;
  unsigned long long issued_ = 0;
};

}  // namespace kb
