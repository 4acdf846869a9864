// ONNX Slice semantics for one axis, shared by the Slice shape inferer, its kernel and its
// gradient: negative bounds count from the end, bounds clamp to the axis, negative steps walk back.
#pragma once

#include <algorithm>
#include <cstdint>

namespace graphtrain {

struct SliceAxis {
  int64_t start, step, count;
};

inline SliceAxis slice_axis(int64_t dim, int64_t start, int64_t end, int64_t step) {
  if (start < 0) start += dim;
  if (end < 0) end += dim;
  if (step > 0) {
    start = std::clamp<int64_t>(start, 0, dim);
    end = std::clamp<int64_t>(end, 0, dim);
  } else {
    start = std::clamp<int64_t>(start, 0, dim - 1);
    end = std::clamp<int64_t>(end, -1, dim - 1);
  }
  int64_t count = step > 0 ? (end - start + step - 1) / step : (start - end - step - 1) / (-step);
  return {start, step, std::max<int64_t>(0, count)};
}

}  // namespace graphtrain
