// Shared CPU kernel helpers that are not templates.
#include <algorithm>
#include <cstring>

#include "kernels/cpu/common.h"

namespace graphtrain::cpu {
namespace {

template <typename T>
void gather_strided_as(char* dst, const char* src, int64_t count, int64_t stride) {
  auto* d = reinterpret_cast<T*>(dst);
  auto* s = reinterpret_cast<const T*>(src);
  if (stride == 0)  // a broadcast element (Expand of a [..., 1] mask)
    std::fill_n(d, count, s[0]);
  else
    for (int64_t i = 0; i < count; ++i) d[i] = s[i * stride];
}

// Copies `count` elements of size `es` from src with stride `stride` (elements) to dst densely.
void gather_strided(char* dst, const char* src, int64_t count, int64_t stride, size_t es) {
  switch (es) {
    case 1:
      return gather_strided_as<uint8_t>(dst, src, count, stride);
    case 2:
      return gather_strided_as<uint16_t>(dst, src, count, stride);
    case 4:
      return gather_strided_as<uint32_t>(dst, src, count, stride);
    case 8:
      return gather_strided_as<uint64_t>(dst, src, count, stride);
  }
  for (int64_t i = 0; i < count; ++i)
    std::memcpy(dst + i * static_cast<int64_t>(es), src + i * stride * static_cast<int64_t>(es),
                es);
}

}  // namespace

// Writes the output of a strided view of `x` (sizes `out_shape`, element strides `strides`, start
// offset `base`) densely into `out`, parallel over rows.
void copy_strided(KernelContext& ctx, const Tensor& x, const Shape& out_shape,
                  const std::vector<int64_t>& strides, int64_t base, Tensor& out) {
  size_t es = dtype_size(x.dtype());
  const char* src = static_cast<const char*>(x.raw_data());
  char* dst = static_cast<char*>(out.raw_data());
  size_t rank = out_shape.size();
  if (rank == 0) {
    std::memcpy(dst, src + base * static_cast<int64_t>(es), es);
    return;
  }
  int64_t inner = out_shape.back();
  int64_t inner_stride = strides.back();
  int64_t rows = inner ? shape_numel(out_shape) / inner : 0;
  parallel_for(ctx, rows, inner, [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      int64_t rem = r, off = base;
      for (size_t i = rank - 1; i-- > 0;) {
        off += (rem % out_shape[i]) * strides[i];
        rem /= out_shape[i];
      }
      char* d = dst + r * inner * static_cast<int64_t>(es);
      const char* s = src + off * static_cast<int64_t>(es);
      if (inner_stride == 1)
        std::memcpy(d, s, static_cast<size_t>(inner) * es);
      else
        gather_strided(d, s, inner, inner_stride, es);
    }
  });
}

std::vector<int64_t> contiguous_strides(const Shape& s) {
  std::vector<int64_t> st(s.size(), 1);
  for (size_t i = s.size(); i-- > 1;) st[i - 1] = st[i] * s[i];
  return st;
}

}  // namespace graphtrain::cpu

namespace graphtrain::cpu {

Tensor permute(KernelContext& ctx, const Tensor& x, const std::vector<int64_t>& perm) {
  std::vector<int64_t> in_strides = contiguous_strides(x.shape());
  Shape out_shape;
  std::vector<int64_t> strides;
  for (int64_t p : perm) {
    out_shape.push_back(x.dim(static_cast<size_t>(p)));
    strides.push_back(in_strides[static_cast<size_t>(p)]);
  }
  Tensor out = Tensor::empty(x.dtype(), out_shape);
  if (out.numel() > 0) copy_strided(ctx, x, out_shape, strides, 0, out);
  return out;
}

}  // namespace graphtrain::cpu
