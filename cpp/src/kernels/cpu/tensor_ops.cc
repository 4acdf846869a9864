// CPU kernels: ops that reshape, move, select, pad or create data; their gradient kernels.
#include <cmath>
#include <cstring>

#include "core/slicing.h"
#include "graphtrain/error.h"
#include "kernels/cpu/common.h"

namespace graphtrain::cpu {
namespace {

constexpr DType I64 = DType::kInt64;

std::vector<int64_t> int_input(KernelContext& ctx, size_t i) {
  return ctx.input(i).to_int64_vector();
}

void reshape(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  std::vector<int64_t> target = int_input(ctx, 1);
  bool allowzero = ctx.node().attr_int("allowzero", 0) != 0;
  Shape out;
  int infer = -1;
  int64_t known = 1;
  for (size_t i = 0; i < target.size(); ++i) {
    int64_t d = target[i];
    if (d == -1) {
      if (infer >= 0) ctx.fail("the target shape has more than one -1");
      infer = static_cast<int>(i);
      out.push_back(1);
      continue;
    }
    if (d == 0 && !allowzero) {
      if (i >= x.rank())
        ctx.fail(str_cat("target dim ", i, " is 0 (copy) but the input has rank ", x.rank()));
      d = x.dim(i);
    }
    if (d < 0) ctx.fail(str_cat("invalid target shape ", target));
    out.push_back(d);
    known *= d;
  }
  if (infer >= 0) {
    if (known == 0 || x.numel() % known != 0)
      ctx.fail(str_cat("cannot reshape ", x.numel(), " elements to ", target));
    out[static_cast<size_t>(infer)] = x.numel() / known;
  }
  if (shape_numel(out) != x.numel())
    ctx.fail(str_cat("cannot reshape ", x.describe(), " to ", out));
  ctx.set_output(0, x.view(out));
}

void flatten(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  int64_t rank = static_cast<int64_t>(x.rank());
  int64_t axis = ctx.node().attr_int("axis", 1);
  if (axis < 0) axis += rank;
  if (axis < 0 || axis > rank) ctx.fail(str_cat("axis ", axis, " is out of range"));
  int64_t outer = 1;
  for (int64_t i = 0; i < axis; ++i) outer *= x.dim(static_cast<size_t>(i));
  ctx.set_output(0, x.view({outer, outer ? x.numel() / outer : 0}));
}

std::vector<int64_t> axes_of(KernelContext& ctx) {
  if (ctx.has_input(1)) return int_input(ctx, 1);
  return ctx.node().attr_ints("axes");
}

void unsqueeze(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  std::vector<int64_t> axes = axes_of(ctx);
  int64_t rank = static_cast<int64_t>(x.rank() + axes.size());
  std::vector<bool> added(static_cast<size_t>(rank), false);
  for (int64_t a : axes) {
    int64_t n = axis_of(ctx, a, rank);
    if (added[static_cast<size_t>(n)]) ctx.fail(str_cat("axis ", a, " is listed twice"));
    added[static_cast<size_t>(n)] = true;
  }
  Shape out;
  size_t src = 0;
  for (int64_t i = 0; i < rank; ++i)
    out.push_back(added[static_cast<size_t>(i)] ? 1 : x.dim(src++));
  ctx.set_output(0, x.view(out));
}

void squeeze(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  std::vector<int64_t> axes = axes_of(ctx);
  int64_t rank = static_cast<int64_t>(x.rank());
  std::vector<bool> drop(x.rank(), axes.empty());
  if (axes.empty())
    for (size_t i = 0; i < x.rank(); ++i) drop[i] = x.dim(i) == 1;
  for (int64_t a : axes) {
    int64_t n = axis_of(ctx, a, rank);
    if (x.dim(static_cast<size_t>(n)) != 1)
      ctx.fail(str_cat("cannot squeeze axis ", a, " of size ", x.dim(static_cast<size_t>(n))));
    drop[static_cast<size_t>(n)] = true;
  }
  Shape out;
  for (size_t i = 0; i < x.rank(); ++i)
    if (!drop[i]) out.push_back(x.dim(i));
  ctx.set_output(0, x.view(out));
}

void transpose(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  std::vector<int64_t> perm = ctx.node().attr_ints("perm");
  if (perm.empty())
    for (int64_t i = static_cast<int64_t>(x.rank()) - 1; i >= 0; --i) perm.push_back(i);
  if (perm.size() != x.rank()) ctx.fail(str_cat("perm ", perm, " does not match rank ", x.rank()));
  std::vector<int64_t> in_strides = contiguous_strides(x.shape());
  Shape out_shape;
  std::vector<int64_t> strides;
  for (int64_t p : perm) {
    int64_t a = axis_of(ctx, p, static_cast<int64_t>(x.rank()));
    out_shape.push_back(x.dim(static_cast<size_t>(a)));
    strides.push_back(in_strides[static_cast<size_t>(a)]);
  }
  Tensor& out = ctx.allocate_output(0, x.dtype(), out_shape);
  if (out.numel() == 0) return;
  copy_strided(ctx, x, out_shape, strides, 0, out);
}

void slice(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  std::vector<int64_t> starts = int_input(ctx, 1), ends = int_input(ctx, 2);
  if (starts.size() != ends.size()) ctx.fail("starts and ends differ in length");
  std::vector<int64_t> axes, steps;
  if (ctx.has_input(3)) axes = int_input(ctx, 3);
  if (ctx.has_input(4)) steps = int_input(ctx, 4);
  int64_t rank = static_cast<int64_t>(x.rank());
  std::vector<SliceAxis> ax(x.rank());
  for (size_t i = 0; i < x.rank(); ++i) ax[i] = {0, 1, x.dim(i)};
  for (size_t k = 0; k < starts.size(); ++k) {
    int64_t a = axes.empty() ? static_cast<int64_t>(k) : axis_of(ctx, axes[k], rank);
    int64_t step = steps.empty() ? 1 : steps[k];
    if (step == 0) ctx.fail("a slice step is 0");
    ax[static_cast<size_t>(a)] =
        slice_axis(x.dim(static_cast<size_t>(a)), starts[k], ends[k], step);
  }
  std::vector<int64_t> in_strides = contiguous_strides(x.shape());
  Shape out_shape;
  std::vector<int64_t> strides;
  int64_t base = 0;
  for (size_t i = 0; i < x.rank(); ++i) {
    out_shape.push_back(ax[i].count);
    strides.push_back(in_strides[i] * ax[i].step);
    base += ax[i].start * in_strides[i];
  }
  Tensor& out = ctx.allocate_output(0, x.dtype(), out_shape);
  if (out.numel() == 0) return;
  copy_strided(ctx, x, out_shape, strides, base, out);
}

void gather(KernelContext& ctx) {
  const Tensor& data = ctx.input(0);
  const Tensor& idx = ctx.input(1);
  int64_t rank = static_cast<int64_t>(data.rank());
  if (rank == 0) ctx.fail("data must have rank 1 or more");
  int64_t axis = axis_of(ctx, ctx.node().attr_int("axis", 0), rank);
  std::vector<int64_t> indices = idx.to_int64_vector();
  int64_t n = data.dim(static_cast<size_t>(axis));
  for (int64_t& i : indices) {
    if (i < -n || i >= n)
      ctx.fail(str_cat("index ", i, " is out of range for axis ", axis, " of size ", n));
    if (i < 0) i += n;
  }
  Shape out_shape(data.shape().begin(), data.shape().begin() + axis);
  out_shape.insert(out_shape.end(), idx.shape().begin(), idx.shape().end());
  out_shape.insert(out_shape.end(), data.shape().begin() + axis + 1, data.shape().end());
  Tensor& out = ctx.allocate_output(0, data.dtype(), out_shape);
  int64_t outer = 1, inner = 1;
  for (int64_t i = 0; i < axis; ++i) outer *= data.dim(static_cast<size_t>(i));
  for (int64_t i = axis + 1; i < rank; ++i) inner *= data.dim(static_cast<size_t>(i));
  size_t row_bytes = static_cast<size_t>(inner) * dtype_size(data.dtype());
  const char* src = static_cast<const char*>(data.raw_data());
  char* dst = static_cast<char*>(out.raw_data());
  int64_t k = static_cast<int64_t>(indices.size());
  parallel_for(ctx, outer * k, inner, [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      int64_t o = r / k, j = r % k;
      std::memcpy(dst + r * static_cast<int64_t>(row_bytes),
                  src + (o * n + indices[static_cast<size_t>(j)]) * static_cast<int64_t>(row_bytes),
                  row_bytes);
    }
  });
}

// Pad(data, pads, constant_value?) in constant mode; negative pads crop. pads: [begin..., end...].
void pad(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  std::string mode = ctx.node().attr_string("mode", "constant");
  if (mode != "constant") ctx.fail("mode '" + mode + "' is not supported (constant only)");
  std::vector<int64_t> pads = ctx.input(1).to_int64_vector();
  size_t rank = x.rank();
  if (rank == 0) ctx.fail("data must have rank 1 or more");
  if (pads.size() != 2 * rank)
    ctx.fail(
        str_cat("pads has ", pads.size(), " values; data of rank ", rank, " needs ", 2 * rank));
  Shape out_shape(rank);
  for (size_t i = 0; i < rank; ++i) {
    out_shape[i] = x.dim(i) + pads[i] + pads[i + rank];
    if (out_shape[i] < 0) ctx.fail(str_cat("pads ", pads, " crop more than dim ", i, " holds"));
  }
  Tensor& out = ctx.allocate_output(0, x.dtype(), out_shape);
  size_t es = dtype_size(x.dtype());
  char* dst = static_cast<char*>(out.raw_data());
  // The fill value, as bytes of the element type (zero when absent).
  std::vector<char> fill(es, 0);
  if (ctx.has_input(2) && ctx.input(2).numel() > 0)
    std::memcpy(fill.data(), ctx.input(2).raw_data(), es);
  bool zero_fill = std::all_of(fill.begin(), fill.end(), [](char c) { return c == 0; });
  if (out.numel() == 0) return;
  int64_t inner = out_shape[rank - 1];
  int64_t rows = out.numel() / inner;
  std::vector<int64_t> xstr = contiguous_strides(x.shape());
  const char* src = static_cast<const char*>(x.raw_data());
  int64_t lo = pads[rank - 1], in_inner = x.dim(rank - 1);
  parallel_for(ctx, rows, inner, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      char* row = dst + r * inner * static_cast<int64_t>(es);
      // Source row of output row r, or none when a leading index falls in the padding.
      int64_t rem = r, off = 0;
      bool inside = true;
      for (size_t d = rank - 1; d-- > 0;) {
        int64_t i = rem % out_shape[d] - pads[d];
        rem /= out_shape[d];
        if (i < 0 || i >= x.dim(d)) inside = false;
        off += i * xstr[d];
      }
      // Output columns [c0, c1) come from input columns [c0 - lo, c1 - lo).
      int64_t c0 = inside ? std::clamp<int64_t>(lo, 0, inner) : inner;
      int64_t c1 = inside ? std::clamp<int64_t>(lo + in_inner, c0, inner) : inner;
      auto fill_cols = [&](int64_t a, int64_t b) {
        if (zero_fill) {
          std::memset(row + a * static_cast<int64_t>(es), 0, static_cast<size_t>(b - a) * es);
          return;
        }
        for (int64_t c = a; c < b; ++c)
          std::memcpy(row + c * static_cast<int64_t>(es), fill.data(), es);
      };
      if (!inside) {
        fill_cols(0, inner);
        continue;
      }
      fill_cols(0, c0);
      std::memcpy(row + c0 * static_cast<int64_t>(es),
                  src + (off + c0 - lo) * static_cast<int64_t>(es),
                  static_cast<size_t>(c1 - c0) * es);
      fill_cols(c1, inner);
    }
  });
}

// GatherElements(data, indices): out[i] = data[i with axis index replaced by indices[i]].
void gather_elements(KernelContext& ctx) {
  const Tensor& data = ctx.input(0);
  const Tensor& idx = ctx.input(1);
  int64_t rank = static_cast<int64_t>(data.rank());
  if (static_cast<int64_t>(idx.rank()) != rank)
    ctx.fail(str_cat("indices must have the rank of data (", rank, "), has ", idx.rank()));
  int64_t axis = axis_of(ctx, ctx.node().attr_int("axis", 0), rank);
  std::vector<int64_t> indices = idx.to_int64_vector();
  Tensor& out = ctx.allocate_output(0, data.dtype(), idx.shape());
  std::vector<int64_t> dstr = contiguous_strides(data.shape());
  size_t es = dtype_size(data.dtype());
  const char* src = static_cast<const char*>(data.raw_data());
  char* dst = static_cast<char*>(out.raw_data());
  int64_t n = data.dim(static_cast<size_t>(axis));
  for (int64_t e = 0; e < out.numel(); ++e) {
    int64_t rem = e, off = 0;
    for (int64_t d = rank - 1; d >= 0; --d) {
      int64_t i = rem % idx.dim(static_cast<size_t>(d));
      rem /= idx.dim(static_cast<size_t>(d));
      if (d == axis) {
        i = indices[static_cast<size_t>(e)];
        if (i < -n || i >= n) ctx.fail(str_cat("index ", i, " is out of range for axis size ", n));
        if (i < 0) i += n;
      }
      off += i * dstr[static_cast<size_t>(d)];
    }
    std::memcpy(dst + e * static_cast<int64_t>(es), src + off * static_cast<int64_t>(es), es);
  }
}

// GatherElementsGrad(dy, data_shape, indices): dy scattered (added) into zeros of data's shape,
// in element order (deterministic).
void gather_elements_grad(KernelContext& ctx) {
  const Tensor& dy = ctx.input(0);
  Shape xs = shape_input(ctx, 1);
  std::vector<int64_t> indices = ctx.input(2).to_int64_vector();
  int64_t rank = static_cast<int64_t>(xs.size());
  int64_t axis = axis_of(ctx, ctx.node().attr_int("axis", 0), rank);
  Tensor& dx = ctx.allocate_output(0, F32, xs);
  std::memset(dx.raw_data(), 0, dx.nbytes());
  std::vector<int64_t> xstr = contiguous_strides(xs);
  const float* g = dy.data<float>();
  float* o = dx.data<float>();
  int64_t n = xs[static_cast<size_t>(axis)];
  for (int64_t e = 0; e < dy.numel(); ++e) {
    int64_t rem = e, off = 0;
    for (int64_t d = rank - 1; d >= 0; --d) {
      int64_t i = rem % dy.dim(static_cast<size_t>(d));
      rem /= dy.dim(static_cast<size_t>(d));
      if (d == axis)
        i = indices[static_cast<size_t>(e)] < 0 ? indices[static_cast<size_t>(e)] + n
                                                : indices[static_cast<size_t>(e)];
      off += i * xstr[static_cast<size_t>(d)];
    }
    o[off] += g[e];
  }
}

void concat(KernelContext& ctx) {
  const Tensor& first = ctx.input(0);
  int64_t rank = static_cast<int64_t>(first.rank());
  int64_t axis = axis_of(ctx, ctx.node().attr(std::string("axis"), Attribute::Kind::kInt).i, rank);
  Shape out_shape = first.shape();
  out_shape[static_cast<size_t>(axis)] = 0;
  for (size_t i = 0; i < ctx.num_inputs(); ++i) {
    const Tensor& t = ctx.input(i);
    if (t.rank() != first.rank() || t.dtype() != first.dtype())
      ctx.fail(str_cat("input ", i, " is ", t.describe(), ", input 0 is ", first.describe()));
    for (int64_t d = 0; d < rank; ++d)
      if (d != axis && t.dim(static_cast<size_t>(d)) != first.dim(static_cast<size_t>(d)))
        ctx.fail(str_cat("input ", i, " differs from input 0 outside axis ", axis));
    out_shape[static_cast<size_t>(axis)] += t.dim(static_cast<size_t>(axis));
  }
  Tensor& out = ctx.allocate_output(0, first.dtype(), out_shape);
  int64_t outer = 1, inner = 1;
  for (int64_t i = 0; i < axis; ++i) outer *= out_shape[static_cast<size_t>(i)];
  for (int64_t i = axis + 1; i < rank; ++i) inner *= out_shape[static_cast<size_t>(i)];
  size_t es = dtype_size(first.dtype());
  int64_t out_row = out_shape[static_cast<size_t>(axis)] * inner * static_cast<int64_t>(es);
  char* dst = static_cast<char*>(out.raw_data());
  // One pass over the output's rows, each written whole from its pieces in order.
  std::vector<const char*> srcs;
  std::vector<int64_t> rows;
  for (size_t i = 0; i < ctx.num_inputs(); ++i) {
    const Tensor& t = ctx.input(i);
    srcs.push_back(static_cast<const char*>(t.raw_data()));
    rows.push_back(t.dim(static_cast<size_t>(axis)) * inner * static_cast<int64_t>(es));
  }
  parallel_for(ctx, outer, out_row / static_cast<int64_t>(es) + 1, [&](int64_t lo, int64_t hi) {
    for (int64_t o = lo; o < hi; ++o) {
      char* d = dst + o * out_row;
      for (size_t i = 0; i < srcs.size(); ++i) {
        std::memcpy(d, srcs[i] + o * rows[i], static_cast<size_t>(rows[i]));
        d += rows[i];
      }
    }
  });
}

void split(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  int64_t rank = static_cast<int64_t>(x.rank());
  int64_t axis = axis_of(ctx, ctx.node().attr_int("axis", 0), rank);
  int64_t dim = x.dim(static_cast<size_t>(axis));
  size_t n = ctx.num_outputs();
  if (n == 0) ctx.fail("Split needs at least one output");
  std::vector<int64_t> sizes;
  if (ctx.has_input(1))
    sizes = int_input(ctx, 1);
  else
    sizes = ctx.node().attr_ints("split");
  if (sizes.empty()) {
    int64_t chunk = (dim + static_cast<int64_t>(n) - 1) / static_cast<int64_t>(n);
    for (size_t i = 0; i < n; ++i)
      sizes.push_back(std::max<int64_t>(0, std::min(chunk, dim - chunk * static_cast<int64_t>(i))));
  }
  int64_t total = 0;
  for (int64_t s : sizes) total += s;
  if (sizes.size() != n || total != dim)
    ctx.fail(str_cat("split sizes ", sizes, " do not cover axis ", axis, " of size ", dim, " in ",
                     n, " outputs"));
  int64_t outer = 1, inner = 1;
  for (int64_t i = 0; i < axis; ++i) outer *= x.dim(static_cast<size_t>(i));
  for (int64_t i = axis + 1; i < rank; ++i) inner *= x.dim(static_cast<size_t>(i));
  size_t es = dtype_size(x.dtype());
  int64_t in_row = dim * inner * static_cast<int64_t>(es);
  const char* src = static_cast<const char*>(x.raw_data());
  std::vector<char*> dsts;
  std::vector<int64_t> rows;
  for (size_t i = 0; i < n; ++i) {
    Shape s = x.shape();
    s[static_cast<size_t>(axis)] = sizes[i];
    dsts.push_back(static_cast<char*>(ctx.allocate_output(i, x.dtype(), s).raw_data()));
    rows.push_back(sizes[i] * inner * static_cast<int64_t>(es));
  }
  // One pass over the input's rows, each read whole into its pieces in order.
  parallel_for(ctx, outer, in_row / static_cast<int64_t>(es) + 1, [&](int64_t lo, int64_t hi) {
    for (int64_t o = lo; o < hi; ++o) {
      const char* from = src + o * in_row;
      for (size_t i = 0; i < n; ++i) {
        std::memcpy(dsts[i] + o * rows[i], from, static_cast<size_t>(rows[i]));
        from += rows[i];
      }
    }
  });
}

void expand(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  std::vector<int64_t> target = int_input(ctx, 1);
  Shape tshape(target.begin(), target.end());
  Broadcaster bc(ctx, {&x.shape(), &tshape});
  Tensor& out = ctx.allocate_output(0, x.dtype(), bc.out_shape());
  if (out.numel() == 0) return;
  // The input's strides over the output dims (0 where broadcast).
  const Shape& os = bc.out_shape();
  std::vector<int64_t> strides(os.size(), 0);
  std::vector<int64_t> in_strides = contiguous_strides(x.shape());
  for (size_t i = 0; i < x.rank(); ++i) {
    size_t o = os.size() - x.rank() + i;
    strides[o] = x.dim(i) == 1 ? 0 : in_strides[i];
  }
  copy_strided(ctx, x, os, strides, 0, out);
}

void trilu(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  if (x.rank() < 2) ctx.fail("input must have rank 2 or more");
  int64_t k = ctx.has_input(1) ? int_input(ctx, 1).at(0) : 0;
  bool upper = ctx.node().attr_int("upper", 1) != 0;
  Tensor& out = ctx.allocate_output(0, x.dtype(), x.shape());
  int64_t rows = x.dim(x.rank() - 2), cols = x.dim(x.rank() - 1);
  int64_t mats = rows * cols != 0 ? x.numel() / (rows * cols) : 0;
  size_t es = dtype_size(x.dtype());
  const char* src = static_cast<const char*>(x.raw_data());
  char* dst = static_cast<char*>(out.raw_data());
  std::memset(dst, 0, out.nbytes());
  for (int64_t m = 0; m < mats; ++m)
    for (int64_t i = 0; i < rows; ++i) {
      // upper keeps j >= i + k; lower keeps j <= i + k.
      int64_t lo = upper ? std::clamp<int64_t>(i + k, 0, cols) : 0;
      int64_t hi = upper ? cols : std::clamp<int64_t>(i + k + 1, 0, cols);
      if (hi > lo) {
        int64_t off = ((m * rows + i) * cols + lo) * static_cast<int64_t>(es);
        std::memcpy(dst + off, src + off, static_cast<size_t>(hi - lo) * es);
      }
    }
}

Tensor constant_value(const Node& n) {
  if (const Tensor* t = n.attr_tensor("value")) return *t;
  if (n.has_attr("value_float")) {
    Tensor t = Tensor::empty(DType::kFloat32, {});
    *t.data<float>() = n.attr_float("value_float", 0);
    return t;
  }
  if (n.has_attr("value_floats")) {
    auto v = n.attr_floats("value_floats");
    return Tensor::from_vector(DType::kFloat32, {static_cast<int64_t>(v.size())}, v);
  }
  if (n.has_attr("value_int")) return Tensor::scalar_int64(n.attr_int("value_int", 0));
  if (n.has_attr("value_ints")) {
    auto v = n.attr_ints("value_ints");
    return Tensor::from_vector(I64, {static_cast<int64_t>(v.size())}, v);
  }
  throw Error(n.describe() + ": needs one of the attributes value, value_float(s), value_int(s)");
}

class ConstantKernel : public OpKernel {
 public:
  explicit ConstantKernel(const Node& n) : value_(constant_value(n)) {}
  void compute(KernelContext& ctx) override { ctx.set_output(0, value_); }

 private:
  Tensor value_;
};

void constant_of_shape(KernelContext& ctx) {
  std::vector<int64_t> dims = int_input(ctx, 0);
  const Tensor* v = ctx.node().attr_tensor("value");
  DType dtype = v ? v->dtype() : DType::kFloat32;
  for (int64_t d : dims)
    if (d < 0) ctx.fail(str_cat("negative dim in shape ", dims));
  Tensor& out = ctx.allocate_output(0, dtype, Shape(dims.begin(), dims.end()));
  size_t es = dtype_size(dtype);
  char* dst = static_cast<char*>(out.raw_data());
  if (!v) {
    std::memset(dst, 0, out.nbytes());
    return;
  }
  for (int64_t i = 0; i < out.numel(); ++i)
    std::memcpy(dst + i * static_cast<int64_t>(es), v->raw_data(), es);
}

void shape_op(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  int64_t rank = static_cast<int64_t>(x.rank());
  int64_t start = ctx.node().attr_int("start", 0), end = ctx.node().attr_int("end", rank);
  if (start < 0) start += rank;
  if (end < 0) end += rank;
  start = std::clamp<int64_t>(start, 0, rank);
  end = std::clamp<int64_t>(end, start, rank);
  Tensor& out = ctx.allocate_output(0, I64, {end - start});
  for (int64_t i = start; i < end; ++i)
    out.data<int64_t>()[i - start] = x.dim(static_cast<size_t>(i));
}

template <typename T>
void range_typed(KernelContext& ctx) {
  T start = ctx.input(0).data<T>()[0], limit = ctx.input(1).data<T>()[0],
    delta = ctx.input(2).data<T>()[0];
  if (delta == 0) ctx.fail("delta is 0");
  double n = std::ceil((static_cast<double>(limit) - static_cast<double>(start)) /
                       static_cast<double>(delta));
  int64_t count = std::max<int64_t>(0, static_cast<int64_t>(n));
  Tensor& out = ctx.allocate_output(0, ctx.input(0).dtype(), {count});
  T* p = out.data<T>();
  for (int64_t i = 0; i < count; ++i) p[i] = static_cast<T>(start + static_cast<T>(i) * delta);
}

void range(KernelContext& ctx) {
  switch (ctx.input(0).dtype()) {
    case DType::kFloat32:
      return range_typed<float>(ctx);
    case DType::kInt64:
      return range_typed<int64_t>(ctx);
    case DType::kInt32:
      return range_typed<int32_t>(ctx);
    default:
      ctx.fail("unsupported element type");
  }
}

void gather_grad(KernelContext& ctx) {
  const Tensor& dy = ctx.input(0);
  Shape data_shape = shape_input(ctx, 1);
  std::vector<int64_t> indices = ctx.input(2).to_int64_vector();
  int64_t rank = static_cast<int64_t>(data_shape.size());
  int64_t axis = axis_of(ctx, ctx.node().attr_int("axis", 0), rank);
  Tensor& dx = ctx.allocate_output(0, F32, data_shape);
  std::memset(dx.raw_data(), 0, dx.nbytes());
  int64_t outer = 1, inner = 1, n = data_shape[static_cast<size_t>(axis)];
  for (int64_t i = 0; i < axis; ++i) outer *= data_shape[static_cast<size_t>(i)];
  for (int64_t i = axis + 1; i < rank; ++i) inner *= data_shape[static_cast<size_t>(i)];
  int64_t k = static_cast<int64_t>(indices.size());
  const float* g = dy.data<float>();
  float* o = dx.data<float>();
  // An embedding's padding row (padding_idx >= 0; torch's -1: none) gets no gradient, as torch's
  // embedding gives it none.
  const int64_t skip = ctx.node().attr_int("padding_idx", -1);
  // Parallel over the inner dim blocks: each thread owns columns, so the scatter-add has no races
  // and every element sums its contributions in index order (deterministic).
  parallel_for(ctx, inner, outer * k, [&](int64_t c0, int64_t c1) {
    for (int64_t ob = 0; ob < outer; ++ob)
      for (int64_t j = 0; j < k; ++j) {
        int64_t idx = indices[static_cast<size_t>(j)];
        if (idx < 0) idx += n;
        if (idx < 0 || idx >= n || idx == skip) continue;
        const float* src = g + (ob * k + j) * inner;
        float* dst = o + (ob * n + idx) * inner;
        for (int64_t c = c0; c < c1; ++c) dst[c] += src[c];
      }
  });
}

void slice_grad(KernelContext& ctx) {
  const Tensor& dy = ctx.input(0);
  Shape xs = shape_input(ctx, 1);
  std::vector<int64_t> starts = ctx.input(2).to_int64_vector(),
                       ends = ctx.input(3).to_int64_vector();
  std::vector<int64_t> axes, steps;
  if (ctx.has_input(4)) axes = ctx.input(4).to_int64_vector();
  if (ctx.has_input(5)) steps = ctx.input(5).to_int64_vector();
  int64_t rank = static_cast<int64_t>(xs.size());
  std::vector<int64_t> start(xs.size(), 0), step(xs.size(), 1);
  for (size_t k = 0; k < starts.size(); ++k) {
    int64_t a = axes.empty() ? static_cast<int64_t>(k) : axis_of(ctx, axes[k], rank);
    int64_t st = steps.empty() ? 1 : steps[k];
    start[static_cast<size_t>(a)] =
        slice_axis(xs[static_cast<size_t>(a)], starts[k], ends[k], st).start;
    step[static_cast<size_t>(a)] = st;
  }
  Tensor& dx = ctx.allocate_output(0, F32, xs);
  std::vector<int64_t> xstr = contiguous_strides(xs);
  int64_t base = 0;
  std::vector<int64_t> strides(xs.size());
  for (size_t i = 0; i < xs.size(); ++i) {
    base += start[i] * xstr[i];
    strides[i] = xstr[i] * step[i];
  }
  const float* g = dy.data<float>();
  float* o = dx.data<float>();
  parallel_for(ctx, dx.numel(), 1, [&](int64_t lo, int64_t hi) {
    std::memset(o + lo, 0, static_cast<size_t>(hi - lo) * sizeof(float));
  });
  if (dy.numel() == 0) return;
  // dY's rows (its last dim) land `strides` apart in dX: parallel over rows, each one copy (a
  // strided one when the last axis steps).
  size_t r = dy.rank();
  int64_t inner = r ? dy.dim(r - 1) : 1, inner_stride = r ? strides[r - 1] : 1;
  int64_t rows = dy.numel() / inner;
  parallel_for(ctx, rows, inner, [&](int64_t lo, int64_t hi) {
    for (int64_t row = lo; row < hi; ++row) {
      int64_t off = base, rem = row;
      for (size_t d = r - 1; r > 0 && d-- > 0;) {
        off += (rem % dy.dim(d)) * strides[d];
        rem /= dy.dim(d);
      }
      const float* src = g + row * inner;
      if (inner_stride == 1)
        std::memcpy(o + off, src, static_cast<size_t>(inner) * sizeof(float));
      else
        for (int64_t i = 0; i < inner; ++i) o[off + i * inner_stride] = src[i];
    }
  });
}

// ScatterND(data, indices [..., q], updates) with reduction none or add: data, with the slice at
// each index tuple (the first q dims) set to (or increased by) its slice of updates; torch's
// index_put (x[idx] = v, x.index_put_(..., accumulate=True)). Later duplicates win (none).
void scatter_nd(KernelContext& ctx) {
  const Tensor& data = ctx.input(0);
  const Tensor& idx = ctx.input(1);
  const Tensor& upd = ctx.input(2);
  std::string reduction = ctx.node().attr_string("reduction", "none");
  if (reduction != "none" && reduction != "add")
    ctx.fail("reduction '" + reduction + "' is not supported (none and add are)");
  bool add = reduction == "add";
  if (add && data.dtype() != F32 && data.dtype() != DType::kInt64)
    ctx.fail("reduction 'add' needs float32 or int64 data");
  if (upd.dtype() != data.dtype()) ctx.fail("updates must have data's element type");
  if (idx.rank() == 0) ctx.fail("indices must have rank 1 or more");
  int64_t q = idx.dim(idx.rank() - 1), rank = static_cast<int64_t>(data.rank());
  if (q < 1 || q > rank) ctx.fail(str_cat("indices' last dim ", q, " must be 1 .. ", rank));
  Shape want(idx.shape().begin(), idx.shape().end() - 1);
  want.insert(want.end(), data.shape().begin() + q, data.shape().end());
  if (upd.shape() != want)
    ctx.fail(str_cat("updates have shape ", upd.shape(), ", indices and data need ", want));
  Tensor& out = ctx.allocate_output(0, data.dtype(), data.shape());
  if (out.raw_data() != data.raw_data())
    std::memcpy(out.raw_data(), data.raw_data(), data.nbytes());
  int64_t slice = 1;
  for (int64_t d = q; d < rank; ++d) slice *= data.dim(static_cast<size_t>(d));
  std::vector<int64_t> tuples = idx.to_int64_vector();
  size_t bytes = static_cast<size_t>(slice) * dtype_size(data.dtype());
  char* po = static_cast<char*>(out.raw_data());
  const char* pu = static_cast<const char*>(upd.raw_data());
  for (int64_t t = 0; t * q < static_cast<int64_t>(tuples.size()); ++t) {  // in order: last wins
    int64_t at = 0;
    for (int64_t d = 0; d < q; ++d) {
      int64_t n = data.dim(static_cast<size_t>(d)), i = tuples[static_cast<size_t>(t * q + d)];
      if (i < -n || i >= n)
        ctx.fail(str_cat("index ", i, " is out of range for dim ", d, " of size ", n));
      at = at * n + (i < 0 ? i + n : i);
    }
    char* dst = po + at * static_cast<int64_t>(bytes);
    const char* src = pu + t * static_cast<int64_t>(bytes);
    if (!add) {
      std::memcpy(dst, src, bytes);
    } else if (data.dtype() == F32) {
      for (int64_t j = 0; j < slice; ++j)
        reinterpret_cast<float*>(dst)[j] += reinterpret_cast<const float*>(src)[j];
    } else {
      for (int64_t j = 0; j < slice; ++j)
        reinterpret_cast<int64_t*>(dst)[j] += reinterpret_cast<const int64_t*>(src)[j];
    }
  }
}

const bool registered = [] {
  register_kernel("", "ScatterND", {}, scatter_nd, 0, in_place({{0, 0}}));
  register_kernel("", "Reshape", {}, reshape);
  register_kernel("", "Flatten", {}, flatten);
  register_kernel("", "Unsqueeze", {}, unsqueeze);
  register_kernel("", "Squeeze", {}, squeeze);
  register_kernel("", "Transpose", {}, transpose);
  register_kernel("", "Slice", {}, slice);
  register_kernel("", "Gather", {}, gather);
  // graphtrain::Gather: ONNX's, with attribute padding_idx for its gradient (an embedding whose
  // padding row gets no gradient).
  register_kernel(GT, "Gather", {}, gather);
  register_kernel("", "Concat", {}, concat);
  register_kernel("", "Split", {}, split);
  register_kernel("", "Expand", {}, expand);
  register_kernel("", "Trilu", {}, trilu);
  register_kernel("", "ConstantOfShape", {}, constant_of_shape);
  register_kernel("", "Shape", {}, shape_op);
  register_kernel("", "Range", {DType::kFloat32, DType::kInt64, DType::kInt32}, range);
  register_stateful_kernel("", "Constant", {},
                           [](const Node& n) { return std::make_unique<ConstantKernel>(n); });
  register_kernel(GT, "GatherGrad", {F32}, gather_grad);
  register_kernel("", "Pad", {}, pad);
  register_kernel("", "GatherElements", {}, gather_elements);
  register_kernel(GT, "GatherElementsGrad", {F32}, gather_elements_grad);
  register_kernel(GT, "SliceGrad", {F32}, slice_grad);
  return true;
}();

}  // namespace
}  // namespace graphtrain::cpu
