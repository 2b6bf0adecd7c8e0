// Host side of TMA for the kbench kernels: cuTensorMapEncodeTiled fetched through the runtime (so the extension
// needs no -lcuda at link time) and a 2-D tile map of a row-major array.
#pragma once
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "driver_api.h"

namespace kb {

using EncodeTiledFn = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                   const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                   CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

inline EncodeTiledFn encode_tiled_fn() {
  static const EncodeTiledFn fn = driver_entry_point<EncodeTiledFn>("cuTensorMapEncodeTiled");
  return fn;
}

// 2-D map over a row-major [rows][cols] array with `pitch_bytes` between rows; box_cols x box_rows tiles. Rows and
// columns past the end read as zeros.
inline bool make_map_2d(CUtensorMap* map, CUtensorMapDataType type, const void* ptr, uint64_t cols, uint64_t rows,
                        uint64_t pitch_bytes, uint32_t box_cols, uint32_t box_rows, CUtensorMapSwizzle swz) {
  EncodeTiledFn fn = encode_tiled_fn();
  if (!fn) return false;
  const cuuint64_t dims[2] = {cols, rows};
  const cuuint64_t strides[1] = {pitch_bytes};
  const cuuint32_t box[2] = {box_cols, box_rows};
  const cuuint32_t estr[2] = {1, 1};
  return fn(map, type, 2, const_cast<void*>(ptr), dims, strides, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE, swz,
            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

}  // namespace kb
