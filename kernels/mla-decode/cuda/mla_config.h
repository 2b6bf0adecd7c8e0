// The attention launch's named configuration and how a shape picks it. Plain C++ (no CUDA): binding.cpp, mla.cu and
// a CPU test (tests/test_knobs.py) include it.
#pragma once
#include <algorithm>

#include "knobs.h"

namespace mla {
constexpr int kTile = 64;                 // cache rows per tile (one TMA box of the attention kernel)
constexpr int kHeads = 128, kHG = 64;     // query heads; per CTA
constexpr int kHeadGroups = kHeads / kHG;  // CTAs per batch row without a split
}  // namespace mla

// KBENCH_PRINT_CONFIG=1 prints the one picked for each shape.
struct MlaConfig {
  int splits;            // CTAs per (batch row, head group) the cache is split over; > 1 adds the combine pass
  bool prefetch_tables;  // the consumers load the next tile's RoPE cos/sin while this tile is processed
  bool s_once;           // attention_s_once.cuh: one warpgroup computes S and the softmax, both P V
  bool rope_first;       // s_once: each tile's rope block loaded first, on its own barrier, and rotated while the
                         // latent blocks land (else the rotation starts once the whole tile has landed)
  bool seesaw;           // attention_seesaw.cuh: the warpgroups take turns at S and the softmax (overrides s_once)
  bool bulk_store;       // s_once, one split: the output rows staged in shared memory and written by bulk copies
  bool staged_st;        // bulk_store: the staged rows written by coalesced 16-byte stores instead of bulk copies
  bool persistent;       // s_once, one split, more work items than SMs: one CTA an SM walks its work items through
                         // one ring (the next item's tiles load under this one's last), rows stored from registers
  bool narrow_tail;      // s_once: the cache's last tile, where it holds <= 16 rows, loaded as 16-row boxes, S by
                         // m64n16 and P V by one k16 step
  bool split_release;    // persistent, rope_first: each stage released and reloaded in two halves (the rope block and
                         // latent blocks 0-3 once warpgroup 0 is done, blocks 4-7 once warpgroup 1 is), S over
                         // blocks 4-7 waiting only for them
};

// bs batch rows, kv_len cache rows to read, sms the GPU's SM count. KBENCH_MLA_SPLITS=N forces N splits;
// KBENCH_MLA_PREFETCH_TABLES=0/1 overrides prefetch_tables, KBENCH_MLA_S_ONCE=0/1 s_once, KBENCH_MLA_ROPE_FIRST=0/1
// rope_first, KBENCH_MLA_SEESAW=0/1 seesaw, KBENCH_MLA_BULK_STORE=0/1 bulk_store, KBENCH_MLA_STAGED_ST=0/1 staged_st,
// KBENCH_MLA_PERSISTENT=0/1 persistent (default: where a CTA an SM gets two or more items), KBENCH_MLA_NARROW_TAIL=0/1
// narrow_tail, KBENCH_MLA_SPLIT_RELEASE=0/1 split_release (default: with the persistent kernel).
// (Measured misses, removed: early S, the next tile's S issued behind this tile's P V, +8.6%,
// docs/mla-decode-notes.md finding 19; split S, both warpgroups sharing each tile's S and softmax, +12.5%, finding
// 26; part of the softmax's exponentials on the FP32 pipes, +0.2 to +1.3%, finding 27; one CTA an SM taking equal
// runs of the work, +52 us with rows shared between runs, -1% with whole rows, finding 29; L2 prefetches of the next
// wave's first data, +3 us, or of the row's later tiles, +9 to +37%, finding 36; Q's first two blocks as S's A
// operand from registers, a tie in time and energy, finding 63; P handed to warpgroup 1 under warpgroup 0's P V, +2%,
// or chunk by chunk inside its softmax, +4%, finding 64, and under it with the split release, +0.3 to +1.3%, finding
// 66; the rope block released as soon as S has read it, a tie, finding 67; a row's two head-group CTAs as a cluster
// sharing each stage's loads by TMA multicast, +1.6%, no less energy, finding 68; warpgroup 1's P V held until the
// next tile's S has landed, +1.6 to +2.0% at 4096 (S shorter, the softmax beside it longer), finding 69.)
inline MlaConfig mla_config(int bs, int kv_len, int sms) {
  // No split where one CTA per (row, head group) already fills >= 90% of its waves (batch 128 on 132 SMs: 256 CTAs
  // in 2 waves, 97%): splitting adds the combine pass and the fp32 partials for no wave gain (measured on two H100s,
  // official protocol: 6-25% faster than 2 splits; docs/mla-decode-notes.md). Otherwise split the cache so that
  // there are about two waves of CTAs, keeping at least 4 tiles per split.
  const int ctas = mla::kHeadGroups * bs, tiles = (kv_len + mla::kTile - 1) / mla::kTile;
  const int waves = (ctas + sms - 1) / sms;
  int splits = 1;
  if (10 * ctas < 9 * waves * sms)
    splits = std::max(1, std::min((2 * sms + ctas - 1) / ctas, std::max(1, tiles / 4)));
  const int forced = kb::env_int("KBENCH_MLA_SPLITS", 0);
  if (forced > 0) splits = std::min(forced, tiles);
  // prefetch_tables: the attention kernel 445 -> 400 us and 640 -> 571 us on the benchmark cases (H100, CUDA events,
  // 2026-11-24; docs/mla-decode-notes.md)
  const bool prefetch_tables = kb::env_int("KBENCH_MLA_PREFETCH_TABLES", 1) != 0;
  // s_once: the attention kernel 397 -> 349 us and 573 -> 504 us on the benchmark cases (H100, CUDA events, one
  // process, 2026-11-24; docs/mla-decode-notes.md, finding 10). 0 runs attention.cuh's schedule (prefetch_tables
  // applies to that one only).
  const bool s_once = kb::env_int("KBENCH_MLA_S_ONCE", 1) != 0;
  // rope_first: the keys' rotation off the tile's critical path (docs/mla-decode-notes.md, finding 17: skipping the
  // rotation altogether took the attention kernel 346 -> 279 us at prefill 4096)
  const bool rope_first = kb::env_int("KBENCH_MLA_ROPE_FIRST", 1) != 0;
  // seesaw: a candidate, as fast as s-once since its own P buffer (docs/mla-decode-notes.md, findings 20 and 30)
  const bool seesaw = kb::env_int("KBENCH_MLA_SEESAW", 0) != 0;
  // bulk_store: a CTA's 64 output rows took 5-10 us of register-to-global stores (8 half-filled 32-byte sectors a warp
  // instruction) with the SM otherwise idle (docs/mla-decode-notes.md, finding 34)
  const bool bulk_store = kb::env_int("KBENCH_MLA_BULK_STORE", 1) != 0;
  // staged_st: the bulk copies' reads of the staged rows took 2.5-4.9 us a CTA before it could exit; ordinary 16-byte
  // stores need not be waited for: attention -0.5 to -3.8 us at batch 128 on two H100s, compute-sanitizer clean
  // (docs/mla-decode-notes.md, findings 36, 37)
  const bool staged_st = kb::env_int("KBENCH_MLA_STAGED_ST", 1) != 0;
  // persistent, where a CTA an SM gets two or more work items (batch 128: 256 items on 132 SMs): the next item's Q
  // and first tiles load under this one's last; attention -1.7 / -0.0 us at prefill 4096 / 6144 alone (clean L2),
  // -2.2 / -1.2 us in the step (profiler timeline), the same bits; with one item a CTA it has nothing to overlap
  // and read +1 to +2 us (batch 66) (docs/mla-decode-notes.md, findings 37 and 61)
  const bool persistent = s_once && !seesaw && splits == 1 && kb::env_int("KBENCH_MLA_PERSISTENT", ctas > sms) != 0;
  // narrow_tail: the benchmark cases' last tile holds one row; attention -0.5 to -2.8 us at batch 128 (two H100s,
  // clean L2), the same bits (docs/mla-decode-notes.md, findings 41, 42)
  const bool narrow_tail = s_once && !seesaw && kb::env_int("KBENCH_MLA_NARROW_TAIL", 1) != 0;
  // split_release, with the persistent kernel: a stage's first half reloads once warpgroup 0 is done with it, not
  // once both are, and S waits for the second half only before its blocks 4-7: the attention in the step -0.9 to
  // -1.1% at prefill 4096 / 6144 (two rounds, one H100), the same bits (docs/mla-decode-notes.md, finding 65)
  const bool split_release = persistent && rope_first && kb::env_int("KBENCH_MLA_SPLIT_RELEASE", 1) != 0;
  return MlaConfig{splits, prefetch_tables, s_once, rope_first, seesaw, bulk_store, staged_st, persistent,
                   narrow_tail, split_release};
}
