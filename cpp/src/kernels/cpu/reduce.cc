// CPU kernels: ReduceSum, ReduceMean, ReduceMax, ReduceMin over any axes; ReduceGrad and
// SumToShape; ArgMax, ArgMin, CumSum and TopK (torch's topk and sort).
#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/cpu/common.h"
#include "kernels/cpu/vec_math.h"

namespace graphtrain::cpu {
namespace {

enum class Kind { kSum, kMean, kMax, kMin };

// What a Reduce node does to x: its output shape, the kept dims (`perm`) and the reduced ones
// (`tail`) in order, and how many elements each output reduces; `noop` for empty axes with
// noop_with_empty_axes (the output is x).
struct Reduction {
  Shape out_shape;
  std::vector<int64_t> perm, tail;
  int64_t cols = 1;
  bool noop = false;
};

template <Kind K>
Reduction reduction_of(KernelContext& ctx, const Tensor& x) {
  Reduction r;
  int64_t rank = static_cast<int64_t>(x.rank());
  std::vector<int64_t> axes =
      ctx.has_input(1) ? ctx.input(1).to_int64_vector() : ctx.node().attr_ints("axes");
  bool keep = ctx.node().attr_int("keepdims", 1) != 0;
  if (axes.empty() && ctx.node().attr_int("noop_with_empty_axes", 0) != 0) {
    r.noop = true;
    return r;
  }
  std::vector<bool> reduced(x.rank(), axes.empty());
  for (int64_t a : axes) reduced[static_cast<size_t>(axis_of(ctx, a, rank))] = true;
  for (size_t i = 0; i < x.rank(); ++i) {
    if (reduced[i]) {
      r.tail.push_back(static_cast<int64_t>(i));
      r.cols *= x.dim(i);
      if (keep) r.out_shape.push_back(1);
    } else {
      r.perm.push_back(static_cast<int64_t>(i));
      r.out_shape.push_back(x.dim(i));
    }
  }
  if ((K == Kind::kMax || K == Kind::kMin) && r.cols == 0 && x.numel() == 0 &&
      shape_numel(r.out_shape) > 0)
    ctx.fail("cannot take the max or min of an empty set");
  return r;
}

// x with the reduced axes moved last: each output element reduces one contiguous row of cols.
Tensor reduced_last(KernelContext& ctx, const Tensor& x, const Reduction& r) {
  std::vector<int64_t> perm = r.perm;
  perm.insert(perm.end(), r.tail.begin(), r.tail.end());
  bool identity = true;
  for (size_t i = 0; i < perm.size(); ++i) identity &= perm[i] == static_cast<int64_t>(i);
  return identity ? x : permute(ctx, x, perm);
}

// ReduceSum, ReduceMax and ReduceMin of integers (index arithmetic: BEiT's relative position
// index sums its coordinates), exact in the element type.
template <Kind K, typename T>
void reduce_integers(KernelContext& ctx, const Tensor& x, const Reduction& r) {
  Tensor src = reduced_last(ctx, x, r);
  Tensor& out = ctx.allocate_output(0, x.dtype(), r.out_shape);
  const T* px = src.data<T>();
  T* po = out.data<T>();
  for (int64_t row = 0; row < out.numel(); ++row) {
    const T* p = px + row * r.cols;
    T acc = K == Kind::kMax   ? std::numeric_limits<T>::lowest()
            : K == Kind::kMin ? std::numeric_limits<T>::max()
                              : T{0};
    for (int64_t i = 0; i < r.cols; ++i)
      acc = K == Kind::kMax   ? std::max(acc, p[i])
            : K == Kind::kMin ? std::min(acc, p[i])
                              : acc + p[i];
    po[row] = acc;
  }
}

template <Kind K>
void reduce(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  int64_t rank = static_cast<int64_t>(x.rank());
  const Reduction red = reduction_of<K>(ctx, x);
  if (red.noop) {
    ctx.set_output(0, x);
    return;
  }
  if (x.dtype() == DType::kInt64) return reduce_integers<K, int64_t>(ctx, x, red);
  if (x.dtype() == DType::kInt32) return reduce_integers<K, int32_t>(ctx, x, red);
  const Shape& out_shape = red.out_shape;
  const std::vector<int64_t>& tail = red.tail;
  const int64_t cols = red.cols;
  // The reduced axes one block that is not last: leading (a bias gradient) or in the middle (the
  // gradient of a repeat, as grouped-query attention's keys): each output row of `width` elements
  // sums `cols` rows of x, added row by row, vectorized.
  bool block = !tail.empty() && tail.back() + 1 < rank &&
               tail.back() - tail.front() + 1 == static_cast<int64_t>(tail.size());
  if (block && (K == Kind::kSum || K == Kind::kMean) && cols > 0) {
    Tensor& out = ctx.allocate_output(0, x.dtype(), out_shape);
    int64_t width = 1;
    for (int64_t i = tail.back() + 1; i < rank; ++i) width *= x.dim(static_cast<size_t>(i));
    int64_t outer = width ? out.numel() / width : 0;
    const float* px = x.data<float>();
    float* po = out.data<float>();
    float scale = K == Kind::kMean ? 1.0f / static_cast<float>(cols) : 1.0f;
    parallel_for(ctx, outer * width, cols, [&](int64_t lo, int64_t hi) {
      std::vector<double> acc(static_cast<size_t>(std::min(hi - lo, width)));
      std::vector<float> part(acc.size());
      float* pp = part.data();
      for (int64_t at = lo; at < hi;) {
        // Columns [j0, j1) of output row o.
        int64_t o = at / width, j0 = at % width, j1 = std::min(width, j0 + (hi - at)), w = j1 - j0;
        const float* rows = px + o * cols * width + j0;
        std::fill(acc.begin(), acc.begin() + w, 0.0);
        // Blocks of 64 rows in float, blocks summed in double: accurate and vectorized. Four
        // rows at a time go into the partial sums (one load and store of them per four rows).
        for (int64_t r0 = 0; r0 < cols; r0 += 64) {
          std::fill(pp, pp + w, 0.0f);
          const int64_t r1 = std::min(cols, r0 + 64);
          int64_t r = r0;
          for (; r + 4 <= r1; r += 4) {
            const float* a = rows + r * width;
            const float *b = a + width, *c = b + width, *d = c + width;
            for (int64_t j = 0; j < w; ++j) pp[j] += (a[j] + b[j]) + (c[j] + d[j]);
          }
          for (; r < r1; ++r) {
            const float* row = rows + r * width;
            for (int64_t j = 0; j < w; ++j) pp[j] += row[j];
          }
          for (int64_t j = 0; j < w; ++j) acc[static_cast<size_t>(j)] += pp[j];
        }
        float* dst = po + o * width + j0;
        for (int64_t j = 0; j < w; ++j)
          dst[j] = static_cast<float>(acc[static_cast<size_t>(j)]) * scale;
        at += w;
      }
    });
    return;
  }
  // Reduced axes last, so each output element reduces one contiguous row.
  Tensor src = reduced_last(ctx, x, red);
  Tensor& out = ctx.allocate_output(0, x.dtype(), out_shape);
  int64_t rows = out.numel();
  const float* px = src.data<float>();
  float* po = out.data<float>();
  parallel_for(ctx, rows, cols, [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const float* p = px + r * cols;
      float acc;
      if (K == Kind::kMax) {
        acc = -std::numeric_limits<float>::infinity();
        for (int64_t i = 0; i < cols; ++i) acc = (p[i] > acc || std::isnan(p[i])) ? p[i] : acc;
      } else if (K == Kind::kMin) {
        acc = std::numeric_limits<float>::infinity();
        for (int64_t i = 0; i < cols; ++i) acc = (p[i] < acc || std::isnan(p[i])) ? p[i] : acc;
      } else {
        // Blocks of 256 summed in 8 lanes, the blocks in double: the rounding error stays small
        // for long rows (a mean over everything), and the order depends on cols alone.
        double total = 0;
        for (int64_t b = 0; b < cols; b += 256)
          total += vec::sum(p + b, std::min<int64_t>(256, cols - b));
        acc = static_cast<float>(K == Kind::kMean ? total / static_cast<double>(cols) : total);
      }
      po[r] = acc;
    }
  });
}

// SumToShape(grad, shape): sums grad over the axes that broadcasting added or stretched.
void sum_to_shape(KernelContext& ctx) {
  const Tensor& g = ctx.input(0);
  Shape target = shape_input(ctx, 1);
  if (g.shape() == target) {
    ctx.set_output(0, g);
    return;
  }
  size_t r = g.rank(), k = target.size();
  if (k > r) ctx.fail(str_cat("cannot reduce ", g.shape(), " to ", target));
  // Output index i of the target corresponds to axis i + (r - k) of g.
  Tensor& out = ctx.allocate_output(0, F32, target);
  std::memset(out.raw_data(), 0, out.nbytes());
  std::vector<int64_t> out_strides(r, 0);
  int64_t st = 1;
  for (size_t i = k; i-- > 0;) {
    int64_t gd = g.dim(i + r - k);
    if (target[i] != gd && target[i] != 1)
      ctx.fail(str_cat("cannot reduce ", g.shape(), " to ", target));
    out_strides[i + r - k] = target[i] == 1 ? 0 : st;
    st *= target[i];
  }
  const float* pg = g.data<float>();
  float* po = out.data<float>();
  int64_t n = g.numel();
  std::vector<int64_t> idx(r, 0);
  int64_t off = 0;
  for (int64_t e = 0; e < n; ++e) {
    po[off] += pg[e];
    for (size_t d = r; d-- > 0;) {
      off += out_strides[d];
      if (++idx[d] < g.dim(d)) break;
      off -= out_strides[d] * idx[d];
      idx[d] = 0;
    }
  }
}

// dY with the reduced axes restored, as a tensor of X's shape (divided by the count for a mean).
void reduce_grad(KernelContext& ctx) {
  const Tensor& dy = ctx.input(0);
  Shape xs = shape_input(ctx, 1);
  int64_t rank = static_cast<int64_t>(xs.size());
  std::vector<int64_t> axes =
      ctx.has_input(2) ? ctx.input(2).to_int64_vector() : std::vector<int64_t>{};
  bool noop = ctx.node().attr_int("noop_with_empty_axes", 0) != 0;
  bool mean = ctx.node().attr_int("mean", 0) != 0;
  Tensor& dx = ctx.allocate_output(0, F32, xs);
  if (axes.empty() && noop) {
    std::memcpy(dx.raw_data(), dy.raw_data(), dx.nbytes());
    return;
  }
  std::vector<bool> reduced(xs.size(), axes.empty());
  for (int64_t a : axes) reduced[static_cast<size_t>(axis_of(ctx, a, rank))] = true;
  // dY viewed with keepdims: stride 0 on reduced axes.
  std::vector<int64_t> strides(xs.size(), 0);
  int64_t st = 1, count = 1;
  for (size_t i = xs.size(); i-- > 0;) {
    if (reduced[i]) {
      count *= xs[i];
      continue;
    }
    strides[i] = st;
    st *= xs[i];
  }
  if (st != dy.numel())
    ctx.fail(str_cat("gradient of ", dy.numel(), " elements does not match ", xs));
  float scale = mean && count ? 1.0f / static_cast<float>(count) : 1.0f;
  // The reduced axes trailing (a mean over everything, or over each row): each dY element fills a
  // run of dX. One block before trailing axes (a sum over the batch, a mean over a sequence):
  // each row of dY repeats. Else a strided copy.
  auto none_reduced = [&](size_t from, size_t to) {
    return std::find(reduced.begin() + static_cast<int64_t>(from),
                     reduced.begin() + static_cast<int64_t>(to),
                     true) == reduced.begin() + static_cast<int64_t>(to);
  };
  size_t trail = xs.size();
  while (trail > 0 && reduced[trail - 1]) --trail;
  size_t first = 0;
  while (first < xs.size() && !reduced[first]) ++first;
  size_t last = first;
  while (last < xs.size() && reduced[last]) ++last;
  bool suffix = none_reduced(0, trail), block = first < last && none_reduced(last, xs.size());
  const float* g = dy.data<float>();
  float* p = dx.data<float>();
  if (suffix && count > 0) {  // dx[i * count + j] = g[i] * scale
    parallel_for(ctx, dx.numel(), 1, [&](int64_t lo, int64_t hi) {
      for (int64_t at = lo; at < hi;) {
        int64_t i = at / count, end = std::min(hi, (i + 1) * count);
        std::fill(p + at, p + end, g[i] * scale);
        at = end;
      }
    });
    return;
  }
  if (block && st > 0) {  // dx[(o * count + r) * width + i] = g[o * width + i] * scale
    int64_t width = 1;
    for (size_t i = last; i < xs.size(); ++i) width *= xs[i];
    parallel_for(ctx, dx.numel() / width, width, [&](int64_t lo, int64_t hi) {
      for (int64_t row = lo; row < hi; ++row) {
        const float* src = g + row / count * width;
        float* dst = p + row * width;
        for (int64_t i = 0; i < width; ++i) dst[i] = src[i] * scale;
      }
    });
    return;
  }
  Tensor tmp = dy;
  copy_strided(ctx, tmp, xs, strides, 0, dx);
  if (scale != 1.0f)
    for (int64_t i = 0; i < dx.numel(); ++i) p[i] *= scale;
}

// ArgMax / ArgMin(x, axis, keepdims): the index of the largest (smallest) element along the axis,
// the first of equals unless select_last_index; a NaN counts as the extreme (torch's argmax and
// max.dim return it).
template <bool kMax>
void arg_reduce(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  int64_t rank = static_cast<int64_t>(x.rank());
  int64_t axis = axis_of(ctx, ctx.node().attr_int("axis", 0), rank);
  bool keep = ctx.node().attr_int("keepdims", 1) != 0;
  bool last = ctx.node().attr_int("select_last_index", 0) != 0;
  int64_t n = x.dim(static_cast<size_t>(axis)), inner = 1, outer = 1;
  for (int64_t i = 0; i < axis; ++i) outer *= x.dim(static_cast<size_t>(i));
  for (int64_t i = axis + 1; i < rank; ++i) inner *= x.dim(static_cast<size_t>(i));
  if (n == 0) ctx.fail("cannot take the index of the extreme of an empty axis");
  Shape out_shape = x.shape();
  if (keep)
    out_shape[static_cast<size_t>(axis)] = 1;
  else
    out_shape.erase(out_shape.begin() + axis);
  Tensor& out = ctx.allocate_output(0, DType::kInt64, out_shape);
  const float* px = x.data<float>();
  int64_t* po = out.data<int64_t>();
  parallel_for(ctx, outer * inner, n, [&](int64_t lo, int64_t hi) {
    for (int64_t line = lo; line < hi; ++line) {
      const float* p = px + (line / inner) * n * inner + line % inner;
      int64_t best = 0;
      float v = p[0];
      for (int64_t k = 1; k < n && !std::isnan(v); ++k) {
        float e = p[k * inner];
        bool better = kMax ? (e > v || (last && e == v)) : (e < v || (last && e == v));
        if (better || std::isnan(e)) {
          best = k;
          v = e;
        }
      }
      po[line] = best;
    }
  });
}

// CumSum(x, axis) with ONNX's exclusive and reverse attributes; sums in index order along the axis.
template <typename T>
void cumsum_typed(KernelContext& ctx, int64_t axis) {
  const Tensor& x = ctx.input(0);
  Tensor& y = ctx.allocate_output(0, x.dtype(), x.shape());
  bool exclusive = ctx.node().attr_int("exclusive", 0) != 0;
  bool reverse = ctx.node().attr_int("reverse", 0) != 0;
  int64_t n = x.dim(static_cast<size_t>(axis)), inner = 1;
  for (size_t i = static_cast<size_t>(axis) + 1; i < x.rank(); ++i) inner *= x.dim(i);
  int64_t outer = n * inner != 0 ? x.numel() / (n * inner) : 0;
  const T* px = x.data<T>();
  T* py = y.data<T>();
  parallel_for(ctx, outer * inner, n, [&](int64_t lo, int64_t hi) {
    for (int64_t line = lo; line < hi; ++line) {
      int64_t base = (line / inner) * n * inner + line % inner;
      T acc = 0;
      for (int64_t k = 0; k < n; ++k) {
        int64_t at = base + (reverse ? n - 1 - k : k) * inner;
        if (exclusive) {
          py[at] = acc;
          acc += px[at];
        } else {
          acc += px[at];
          py[at] = acc;
        }
      }
    }
  });
}

void cumsum(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  std::vector<int64_t> a = ctx.input(1).to_int64_vector();
  if (a.size() != 1) ctx.fail("axis must hold one value");
  int64_t axis = axis_of(ctx, a[0], static_cast<int64_t>(x.rank()));
  switch (x.dtype()) {
    case DType::kFloat32:
      return cumsum_typed<float>(ctx, axis);
    case DType::kInt64:
      return cumsum_typed<int64_t>(ctx, axis);
    default:
      return cumsum_typed<int32_t>(ctx, axis);
  }
}

// TopK(x, k) -> (values, indices) along `axis`: the k largest (smallest with largest=0) in order,
// equal values by index (a stable order: torch's sort and topk on CPU), a NaN above every number.
template <typename T>
void top_k_typed(KernelContext& ctx, int64_t axis, int64_t k) {
  const Tensor& x = ctx.input(0);
  bool largest = ctx.node().attr_int("largest", 1) != 0;
  int64_t n = x.dim(static_cast<size_t>(axis)), inner = 1;
  for (size_t i = static_cast<size_t>(axis) + 1; i < x.rank(); ++i) inner *= x.dim(i);
  int64_t outer = n * inner != 0 ? x.numel() / (n * inner) : 0;
  Shape out_shape = x.shape();
  out_shape[static_cast<size_t>(axis)] = k;
  T* pv = ctx.allocate_output(0, x.dtype(), out_shape).data<T>();
  int64_t* pi = ctx.allocate_output(1, DType::kInt64, out_shape).data<int64_t>();
  const T* px = x.data<T>();
  auto before = [&](const std::pair<T, int64_t>& a, const std::pair<T, int64_t>& b) {
    if constexpr (std::is_floating_point_v<T>) {
      bool na = std::isnan(a.first), nb = std::isnan(b.first);
      if (na || nb) return na != nb ? (largest ? na : nb) : a.second < b.second;
    }
    if (a.first != b.first) return largest ? a.first > b.first : a.first < b.first;
    return a.second < b.second;
  };
  parallel_for(ctx, outer * inner, n * 4, [&](int64_t lo, int64_t hi) {
    std::vector<std::pair<T, int64_t>> line(static_cast<size_t>(n));
    for (int64_t l = lo; l < hi; ++l) {
      int64_t base = (l / inner) * n * inner + l % inner;
      for (int64_t j = 0; j < n; ++j) line[static_cast<size_t>(j)] = {px[base + j * inner], j};
      if (k == n)
        std::sort(line.begin(), line.end(), before);
      else
        std::partial_sort(line.begin(), line.begin() + k, line.end(), before);
      int64_t out = (l / inner) * k * inner + l % inner;
      for (int64_t j = 0; j < k; ++j) {
        pv[out + j * inner] = line[static_cast<size_t>(j)].first;
        pi[out + j * inner] = line[static_cast<size_t>(j)].second;
      }
    }
  });
}

void top_k(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  int64_t axis = axis_of(ctx, ctx.node().attr_int("axis", -1), static_cast<int64_t>(x.rank()));
  std::vector<int64_t> kv = ctx.input(1).to_int64_vector();
  if (kv.size() != 1) ctx.fail("K must hold one value");
  int64_t n = x.dim(static_cast<size_t>(axis));
  if (kv[0] < 0 || kv[0] > n)
    ctx.fail(str_cat("K = ", kv[0], " is outside 0 .. ", n, ", the size of axis ", axis));
  switch (x.dtype()) {
    case DType::kFloat32:
      return top_k_typed<float>(ctx, axis, kv[0]);
    case DType::kInt64:
      return top_k_typed<int64_t>(ctx, axis, kv[0]);
    default:
      return top_k_typed<int32_t>(ctx, axis, kv[0]);
  }
}

const bool registered = [] {
  register_kernel("", "TopK", {F32, DType::kInt64, DType::kInt32}, top_k);
  register_kernel("", "CumSum", {F32, DType::kInt64, DType::kInt32}, cumsum);
  const std::vector<DType> numbers = {F32, DType::kInt64, DType::kInt32};
  register_kernel("", "ReduceSum", numbers, reduce<Kind::kSum>);
  register_kernel("", "ReduceMean", {DType::kFloat32}, reduce<Kind::kMean>);
  register_kernel("", "ReduceMax", numbers, reduce<Kind::kMax>);
  register_kernel("", "ReduceMin", numbers, reduce<Kind::kMin>);
  register_kernel("", "ArgMax", {DType::kFloat32}, arg_reduce<true>);
  register_kernel("", "ArgMin", {DType::kFloat32}, arg_reduce<false>);
  register_kernel(GT, "SumToShape", {F32}, sum_to_shape);
  register_kernel(GT, "ReduceGrad", {F32}, reduce_grad);
  return true;
}();

}  // namespace
}  // namespace graphtrain::cpu
