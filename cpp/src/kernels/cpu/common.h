// Helpers shared by the CPU kernels: broadcasting iteration and parallel loops.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "graphtrain/ops.h"
#include "graphtrain/strings.h"
#include "graphtrain/thread_pool.h"

namespace graphtrain::cpu {

// The graphtrain domain (gradient and fused kernels) and the element type most kernels handle.
inline constexpr const char* GT = kGraphtrainDomain;
inline constexpr DType F32 = DType::kFloat32;

// Elements per parallel chunk below which splitting does not pay.
inline constexpr int64_t kGrain = 1 << 15;

// Runs fn(begin, end) over [0, n) on the pool, in chunks worth `cost_per_item` * items >= kGrain.
template <typename F>
void parallel_for(KernelContext& ctx, int64_t n, int64_t cost_per_item, F&& fn) {
  int64_t grain = std::max<int64_t>(1, kGrain / std::max<int64_t>(1, cost_per_item));
  ctx.pool().parallel_for(n, grain, fn);
}

// Broadcast of up to three inputs to one output shape, with dims coalesced. For output row r
// (all dims but the last), offset(i, r) gives input i's element offset; inner_stride(i) is 0 or 1.
class Broadcaster {
 public:
  Broadcaster(const KernelContext& ctx, const std::vector<const Shape*>& shapes) {
    size_t rank = 0;
    for (const Shape* s : shapes) rank = std::max(rank, s->size());
    out_shape_.assign(rank, 1);
    for (const Shape* s : shapes)
      for (size_t i = 0; i < s->size(); ++i) {
        int64_t d = (*s)[i];
        int64_t& o = out_shape_[rank - s->size() + i];
        if (d == o || d == 1) continue;
        if (o == 1)
          o = d;
        else
          ctx.fail(str_cat("cannot broadcast shapes: dim ", d, " against ", o));
      }
    // Per-input strides over the output dims (0 where broadcast).
    n_ = shapes.size();
    std::vector<std::vector<int64_t>> strides(n_, std::vector<int64_t>(rank, 0));
    for (size_t k = 0; k < n_; ++k) {
      const Shape& s = *shapes[k];
      int64_t st = 1;
      for (size_t i = s.size(); i-- > 0;) {
        size_t o = rank - s.size() + i;
        strides[k][o] = s[i] == 1 ? 0 : st;
        st *= s[i];
      }
    }
    // Coalesce dims i-1 and i when every input is contiguous across them.
    std::vector<int64_t> dims;
    std::vector<std::vector<int64_t>> cs(n_);
    for (size_t i = 0; i < rank; ++i) {
      if (out_shape_[i] == 1) continue;
      bool merge = !dims.empty();
      for (size_t k = 0; k < n_ && merge; ++k)
        merge = cs[k].back() == strides[k][i] * out_shape_[i];
      if (merge) {
        dims.back() *= out_shape_[i];
        for (size_t k = 0; k < n_; ++k) cs[k].back() = strides[k][i];
      } else {
        dims.push_back(out_shape_[i]);
        for (size_t k = 0; k < n_; ++k) cs[k].push_back(strides[k][i]);
      }
    }
    if (dims.empty()) {
      dims.push_back(1);
      for (size_t k = 0; k < n_; ++k) cs[k].push_back(0);
    }
    dims_ = dims;
    strides_ = cs;
    inner_ = dims_.back();
    rows_ = 1;
    for (size_t i = 0; i + 1 < dims_.size(); ++i) rows_ *= dims_[i];
  }

  const Shape& out_shape() const { return out_shape_; }
  int64_t rows() const { return rows_; }
  int64_t inner() const { return inner_; }
  int64_t inner_stride(size_t k) const { return strides_[k].back(); }
  // Offsets of each input at the start of output row r.
  void offsets(int64_t r, int64_t* out) const {
    for (size_t k = 0; k < n_; ++k) out[k] = 0;
    for (size_t i = dims_.size() - 1; i-- > 0;) {
      int64_t idx = r % dims_[i];
      r /= dims_[i];
      for (size_t k = 0; k < n_; ++k) out[k] += idx * strides_[k][i];
    }
  }

 private:
  size_t n_ = 0;
  Shape out_shape_;
  std::vector<int64_t> dims_;
  std::vector<std::vector<int64_t>> strides_;
  int64_t rows_ = 1, inner_ = 1;
};

// out[i] = f(a[i], b[i]) with numpy broadcasting, parallel over rows.
template <typename A, typename B, typename R, typename F>
void binary_broadcast(KernelContext& ctx, const Tensor& a, const Tensor& b, Tensor& out, F f) {
  const A* pa = a.data<A>();
  const B* pb = b.data<B>();
  R* po = out.data<R>();
  if (a.shape() == b.shape()) {
    parallel_for(ctx, a.numel(), 1, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) po[i] = f(pa[i], pb[i]);
    });
    return;
  }
  Broadcaster bc(ctx, {&a.shape(), &b.shape()});
  int64_t inner = bc.inner();
  int64_t sa = bc.inner_stride(0), sb = bc.inner_stride(1);
  // Parallel over output elements, not rows: a broadcast scalar leaves one row of everything.
  parallel_for(ctx, bc.rows() * inner, 1, [&](int64_t lo, int64_t hi) {
    int64_t off[2];
    for (int64_t at = lo; at < hi;) {
      int64_t r = at / inner, i0 = at % inner, i1 = std::min(inner, i0 + (hi - at));
      bc.offsets(r, off);
      const A* x = pa + off[0];
      const B* y = pb + off[1];
      R* o = po + r * inner;
      if (sa && sb)
        for (int64_t i = i0; i < i1; ++i) o[i] = f(x[i], y[i]);
      else if (sa)
        for (int64_t i = i0; i < i1; ++i) o[i] = f(x[i], y[0]);
      else if (sb)
        for (int64_t i = i0; i < i1; ++i) o[i] = f(x[0], y[i]);
      else
        for (int64_t i = i0; i < i1; ++i) o[i] = f(x[0], y[0]);
      at += i1 - i0;
    }
  });
}

// Normalized axis of a run-time tensor; fails through ctx when out of range.
inline int64_t axis_of(const KernelContext& ctx, int64_t axis, int64_t rank) {
  if (axis < -rank || axis >= rank)
    ctx.fail(str_cat("axis ", axis, " is out of range for rank ", rank));
  return axis < 0 ? axis + rank : axis;
}

// The int64 input i read as a shape (a Shape of some forward value, for gradient kernels).
inline Shape shape_input(const KernelContext& ctx, size_t i) {
  std::vector<int64_t> v = ctx.input(i).to_int64_vector();
  return Shape(v.begin(), v.end());
}

// Row-major element strides of a contiguous tensor of shape `s`.
std::vector<int64_t> contiguous_strides(const Shape& s);

// Writes a strided view of `x` (sizes `out_shape`, element strides `strides`, start offset
// `base`, all in elements) densely into `out`, parallel over rows. Any element type.
void copy_strided(KernelContext& ctx, const Tensor& x, const Shape& out_shape,
                  const std::vector<int64_t>& strides, int64_t base, Tensor& out);

// x with its dims permuted (a dense copy).
Tensor permute(KernelContext& ctx, const Tensor& x, const std::vector<int64_t>& perm);

}  // namespace graphtrain::cpu
