// A device's late rings (late_address.h) and the device word the first one fills, as the bindings keep them
// (torch-facing: included by the bindings' .cpp only). moe's output address and mla-decode's output address, cache
// length and input addresses reach their graphs this way; one struct so that both make, find and keep them alike.
#pragma once
#include <torch/extension.h>

#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "late_address.h"

namespace kb {

struct LateRings {
  torch::Tensor word;   // int64 [1] on the device: the address ring 0's record names (or a stream write put there),
                        // where the graph's later kernels read it
  torch::Tensor taken;  // int64 [rings] on the device: each ring's count of the calls the device took
  std::vector<std::unique_ptr<LateAddressRing>> rings;  // ring i: records of the i-th length given to late_rings
  void* published = nullptr;  // the address last handed to `word` (the caller's bookkeeping: moe refuses another)
};

// `like`'s device's rings, with records of `words` words each (ring 0 fills `word`; the others feed kernels that take
// their records themselves); made on the first call where `make`, else null until one made them. Never made inside a
// stream capture (it allocates), never freed (captured graphs hold their addresses). One store a binding: static, as
// held_graphs() (held_graphs.h says why).
static inline LateRings* late_rings(const torch::Tensor& like, std::initializer_list<int> words, bool make = true) {
  static std::mutex mu;
  static auto* all = new std::map<int, LateRings>();
  std::lock_guard<std::mutex> lock(mu);
  const auto it = all->find(like.get_device());
  if (it != all->end()) return &it->second;
  if (!make) return nullptr;
  LateRings& late = (*all)[like.get_device()];
  late.word = torch::zeros({1}, like.options().dtype(torch::kLong));
  late.taken = torch::zeros({static_cast<int64_t>(words.size())}, like.options().dtype(torch::kLong));
  auto* taken = reinterpret_cast<unsigned long long*>(late.taken.data_ptr());
  for (const int n : words) {
    void** slot = late.rings.empty() ? reinterpret_cast<void**>(late.word.data_ptr()) : nullptr;
    late.rings.push_back(std::make_unique<LateAddressRing>(slot, taken + late.rings.size(), n));
  }
  return &late;
}

}  // namespace kb
