// CPU kernels: unary math, binary arithmetic (Min, Max, Clip), comparison and logic with
// broadcasting, Where, Cast, Not, and the gradient kernels of the activations.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "kernels/cpu/common.h"
#include "kernels/cpu/elementwise_math.h"
#include "kernels/cpu/vec_dispatch.h"

namespace graphtrain::cpu {
namespace {

constexpr DType I64 = DType::kInt64;
constexpr DType I32 = DType::kInt32;
constexpr DType BOOL = DType::kBool;

template <typename F>
void unary_f32(KernelContext& ctx, int64_t cost, F f) {
  const Tensor& x = ctx.input(0);
  Tensor& y = ctx.allocate_output(0, x.dtype(), x.shape());
  const float* px = x.data<float>();
  float* py = y.data<float>();
  parallel_for(ctx, x.numel(), cost, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) py[i] = f(px[i]);
  });
}

// f is callable on vec::f8 and on float (a generic lambda): 8 lanes at a time, scalar tail.
template <typename F>
void unary_vec(KernelContext& ctx, int64_t cost, F f) {
  const Tensor& x = ctx.input(0);
  Tensor& y = ctx.allocate_output(0, x.dtype(), x.shape());
  const float* px = x.data<float>();
  float* py = y.data<float>();
  parallel_for(ctx, x.numel(), cost,
               [&](int64_t lo, int64_t hi) { vec::map(px + lo, py + lo, hi - lo, f); });
}

template <typename T, typename F>
void unary_typed(KernelContext& ctx, F f) {
  const Tensor& x = ctx.input(0);
  Tensor& y = ctx.allocate_output(0, x.dtype(), x.shape());
  const T* px = x.data<T>();
  T* py = y.data<T>();
  parallel_for(ctx, x.numel(), 1, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) py[i] = f(px[i]);
  });
}

// A binary op with numpy broadcasting over float32, int64 and int32 (and bool for comparisons).
// Arithmetic keeps the input type (integer Div truncates toward zero, as ONNX specifies);
// comparisons (kBoolOut) produce bool.
template <template <typename> class Op, bool kBoolOut>
void binary_op(KernelContext& ctx) {
  const Tensor& a = ctx.input(0);
  const Tensor& b = ctx.input(1);
  if (a.dtype() != b.dtype())
    ctx.fail(str_cat("inputs must have the same element type, got ", to_string(a.dtype()), " and ",
                     to_string(b.dtype())));
  Broadcaster shape_only(ctx, {&a.shape(), &b.shape()});
  Tensor& out = ctx.allocate_output(0, kBoolOut ? BOOL : a.dtype(), shape_only.out_shape());
  auto run = [&](auto tag) {
    using T = decltype(tag);
    using R = std::conditional_t<kBoolOut, bool, T>;
    binary_broadcast<T, T, R>(ctx, a, b, out, Op<T>{});
  };
  switch (a.dtype()) {
    case F32:
      return run(float{});
    case I64:
      return run(int64_t{});
    case I32:
      return run(int32_t{});
    case BOOL:
      if constexpr (kBoolOut) return run(bool{});
      [[fallthrough]];
    default:
      ctx.fail("unsupported element type");
  }
}

template <typename T>
struct AddOp {
  T operator()(T x, T y) const { return x + y; }
};
template <typename T>
struct SubOp {
  T operator()(T x, T y) const { return x - y; }
};
template <typename T>
struct MulOp {
  T operator()(T x, T y) const { return x * y; }
};
template <typename T>
struct DivOp {
  T operator()(T x, T y) const { return x / y; }
};
template <>
struct DivOp<int64_t> {
  int64_t operator()(int64_t x, int64_t y) const { return y == 0 ? 0 : x / y; }
};
template <>
struct DivOp<int32_t> {
  int32_t operator()(int32_t x, int32_t y) const { return y == 0 ? 0 : x / y; }
};

template <typename T>
struct EqOp {
  bool operator()(T x, T y) const { return x == y; }
};
template <typename T>
struct LtOp {
  bool operator()(T x, T y) const { return x < y; }
};
template <typename T>
struct GtOp {
  bool operator()(T x, T y) const { return x > y; }
};
template <typename T>
struct LeOp {
  bool operator()(T x, T y) const { return x <= y; }
};
template <typename T>
struct GeOp {
  bool operator()(T x, T y) const { return x >= y; }
};

template <typename T>
struct MinOp {
  T operator()(T x, T y) const { return x != x ? x : (y < x ? y : x); }  // NaN propagates
};
template <typename T>
struct MaxOp {
  T operator()(T x, T y) const { return x != x ? x : (y > x ? y : x); }
};

// Integer Mod (ONNX fmod=0): the result takes the divisor's sign, as Python's %.
template <typename T>
struct ModOp {
  T operator()(T x, T y) const {
    if (y == 0) return 0;
    T r = x % y;
    return r != 0 && ((r < 0) != (y < 0)) ? r + y : r;
  }
};

void mod_kernel(KernelContext& ctx) {
  if (ctx.node().attr_int("fmod", 0) != 0) ctx.fail("fmod=1 is not supported");
  const Tensor& a = ctx.input(0);
  const Tensor& b = ctx.input(1);
  Broadcaster shape_only(ctx, {&a.shape(), &b.shape()});
  Tensor& out = ctx.allocate_output(0, a.dtype(), shape_only.out_shape());
  if (a.dtype() != b.dtype()) ctx.fail("inputs must have the same element type");
  if (a.dtype() == I64)
    binary_broadcast<int64_t, int64_t, int64_t>(ctx, a, b, out, ModOp<int64_t>{});
  else
    binary_broadcast<int32_t, int32_t, int32_t>(ctx, a, b, out, ModOp<int32_t>{});
}

template <bool kAnd>
void logical(KernelContext& ctx) {
  const Tensor& a = ctx.input(0);
  const Tensor& b = ctx.input(1);
  Broadcaster shape_only(ctx, {&a.shape(), &b.shape()});
  Tensor& out = ctx.allocate_output(0, BOOL, shape_only.out_shape());
  binary_broadcast<bool, bool, bool>(ctx, a, b, out,
                                     [](bool x, bool y) { return kAnd ? x && y : x || y; });
}

// Clip(x, min?, max?): scalar bounds (absent: unbounded), NaN passes through.
template <typename T>
void clip_typed(KernelContext& ctx) {
  T lo = ctx.has_input(1) ? ctx.input(1).data<T>()[0] : std::numeric_limits<T>::lowest();
  T hi = ctx.has_input(2) ? ctx.input(2).data<T>()[0] : std::numeric_limits<T>::max();
  unary_typed<T>(ctx, [lo, hi](T x) { return x < lo ? lo : (x > hi ? hi : x); });
}

void clip(KernelContext& ctx) {
  for (size_t i = 1; i < 3; ++i)
    if (ctx.has_input(i) && ctx.input(i).numel() != 1)
      ctx.fail(str_cat("input ", i, " (the bound) must hold one value, has shape ",
                       ctx.input(i).shape()));
  switch (ctx.input(0).dtype()) {
    case F32:
      return clip_typed<float>(ctx);
    case I64:
      return clip_typed<int64_t>(ctx);
    default:
      return clip_typed<int32_t>(ctx);
  }
}

void pow_kernel(KernelContext& ctx) {
  const Tensor& a = ctx.input(0);
  const Tensor& b = ctx.input(1);
  Broadcaster shape_only(ctx, {&a.shape(), &b.shape()});
  Tensor& out = ctx.allocate_output(0, a.dtype(), shape_only.out_shape());
  auto p = [](float x, float y) { return math::pow_scalar(x, y); };
  if (b.dtype() == F32) {
    binary_broadcast<float, float, float>(ctx, a, b, out, p);
  } else if (b.dtype() == I64) {
    binary_broadcast<float, int64_t, float>(
        ctx, a, b, out, [&](float x, int64_t y) { return p(x, static_cast<float>(y)); });
  } else {
    ctx.fail("exponent must be float32 or int64");
  }
}

// o[i] = c[i * s0] ? x[i * s1] : y[i * s2] as a select of bit patterns, no branch: a condition
// that flips at random (a ReLU's mask) made the branch miss every other element (2.8 ms against
// 0.1 for MobileNetV2's [16, 48, 32, 32] ReLU6 gradient). Strides of 0 or 1 (each input contiguous
// or one broadcast value) are compile-time constants, so the loop vectorizes.
template <typename T, int64_t S0, int64_t S1, int64_t S2>
void where_row(const uint8_t* __restrict c, const T* __restrict x, const T* __restrict y,
               T* __restrict o, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    T m = static_cast<T>(0) - static_cast<T>(c[i * S0]);
    o[i] = static_cast<T>((x[i * S1] & m) | (y[i * S2] & static_cast<T>(~m)));
  }
}

template <typename T>
using WhereRow = void (*)(const uint8_t*, const T*, const T*, T*, int64_t);

// The row loop for inner strides s0, s1, s2, each 0 or 1 (Broadcaster's inner strides are).
template <typename T>
WhereRow<T> where_row_for(int64_t s0, int64_t s1, int64_t s2) {
  static constexpr WhereRow<T> table[8] = {
      where_row<T, 0, 0, 0>, where_row<T, 0, 0, 1>, where_row<T, 0, 1, 0>, where_row<T, 0, 1, 1>,
      where_row<T, 1, 0, 0>, where_row<T, 1, 0, 1>, where_row<T, 1, 1, 0>, where_row<T, 1, 1, 1>};
  return table[s0 * 4 + s1 * 2 + s2];
}

void where_kernel(KernelContext& ctx) {
  const Tensor& c = ctx.input(0);
  const Tensor& x = ctx.input(1);
  const Tensor& y = ctx.input(2);
  if (c.dtype() != BOOL) ctx.fail("condition must be bool");
  if (x.dtype() != y.dtype()) ctx.fail("X and Y must have the same element type");
  Broadcaster bc(ctx, {&c.shape(), &x.shape(), &y.shape()});
  Tensor& out = ctx.allocate_output(0, x.dtype(), bc.out_shape());
  size_t es = dtype_size(x.dtype());
  // The condition's bytes, 0 or 1, read as integers (a bool load does not vectorize).
  const auto* pc = static_cast<const uint8_t*>(c.raw_data());
  const char* px = static_cast<const char*>(x.raw_data());
  const char* py = static_cast<const char*>(y.raw_data());
  char* po = static_cast<char*>(out.raw_data());
  int64_t inner = bc.inner();
  int64_t s0 = bc.inner_stride(0), s1 = bc.inner_stride(1), s2 = bc.inner_stride(2);
  auto body = [&](auto tag) {
    using T = decltype(tag);
    WhereRow<T> row = where_row_for<T>(s0, s1, s2);
    parallel_for(ctx, bc.rows() * inner, 1, [&](int64_t lo, int64_t hi) {
      // Elements lo..hi of the output, row by row (one row may be split between threads).
      int64_t off[3];
      for (int64_t e = lo; e < hi;) {
        int64_t r = e / inner, i0 = e % inner, n = std::min(hi - e, inner - i0);
        bc.offsets(r, off);
        const uint8_t* cc = pc + off[0] + i0 * s0;
        const T* xx = reinterpret_cast<const T*>(px) + off[1] + i0 * s1;
        const T* yy = reinterpret_cast<const T*>(py) + off[2] + i0 * s2;
        T* o = reinterpret_cast<T*>(po) + e;
        row(cc, xx, yy, o, n);
        e += n;
      }
    });
  };
  switch (es) {
    case 1:
      body(uint8_t{});
      break;
    case 2:
      body(uint16_t{});
      break;
    case 4:
      body(uint32_t{});
      break;
    case 8:
      body(uint64_t{});
      break;
    default:
      ctx.fail("unsupported element size");
  }
}

template <typename From, typename To>
void convert(const Tensor& x, Tensor& y, KernelContext& ctx) {
  const From* px = x.data<From>();
  To* py = y.data<To>();
  parallel_for(ctx, x.numel(), 1, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) py[i] = static_cast<To>(px[i]);
  });
}

// Writes element i of a tensor of any supported type from a double.

void store(Tensor& t, int64_t i, double v) {
  switch (t.dtype()) {
    case DType::kFloat32:
      t.data<float>()[i] = static_cast<float>(v);
      break;
    case DType::kFloat64:
      t.data<double>()[i] = v;
      break;
    case DType::kFloat16:
      t.data<uint16_t>()[i] = float_to_half(static_cast<float>(v));
      break;
    case DType::kBFloat16:
      t.data<uint16_t>()[i] = float_to_bfloat16(static_cast<float>(v));
      break;
    case DType::kInt64:
      t.data<int64_t>()[i] = static_cast<int64_t>(v);
      break;
    case DType::kInt32:
      t.data<int32_t>()[i] = static_cast<int32_t>(v);
      break;
    case DType::kInt8:
      t.data<int8_t>()[i] = static_cast<int8_t>(v);
      break;
    case DType::kUInt8:
      t.data<uint8_t>()[i] = static_cast<uint8_t>(v);
      break;
    case DType::kBool:
      t.data<bool>()[i] = v != 0;
      break;
    case DType::kUndefined:
      break;
  }
}

void cast_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  DType to =
      from_onnx(static_cast<int>(ctx.node().attr(std::string("to"), Attribute::Kind::kInt).i));
  if (to == DType::kUndefined) ctx.fail("unsupported target type");
  if (to == x.dtype()) {
    ctx.set_output(0, x);
    return;
  }
  Tensor& y = ctx.allocate_output(0, to, x.shape());
  // Fast paths for the common conversions; the general one goes through double.
  if (x.dtype() == F32 && to == I64) return convert<float, int64_t>(x, y, ctx);
  if (x.dtype() == I64 && to == F32) return convert<int64_t, float>(x, y, ctx);
  if (x.dtype() == BOOL && to == F32) return convert<bool, float>(x, y, ctx);
  if (x.dtype() == I64 && to == I32) return convert<int64_t, int32_t>(x, y, ctx);
  if (x.dtype() == I32 && to == I64) return convert<int32_t, int64_t>(x, y, ctx);
  parallel_for(ctx, x.numel(), 4, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) store(y, i, x.as_double(i));
  });
}

// A transcendental op of vec_dispatch.h (16 lanes where the CPU has AVX-512), over the pool.
void apply_vec_op(KernelContext& ctx, int64_t cost, VecOp op) {
  const Tensor& a = ctx.input(0);
  const float* pb = nullptr;
  if (op == VecOp::kGeluGrad || op == VecOp::kGeluTanhGrad || op == VecOp::kSiluMul) {
    if (ctx.input(1).shape() != a.shape()) ctx.fail("inputs must have the same shape");
    pb = ctx.input(1).data<float>();
  }
  Tensor& y = ctx.allocate_output(0, F32, a.shape());
  const float* pa = a.data<float>();
  float* py = y.data<float>();
  parallel_for(ctx, a.numel(), cost, [&](int64_t lo, int64_t hi) {
    vec_apply(op, pa + lo, pb ? pb + lo : nullptr, py + lo, hi - lo);
  });
}

// A Gelu's form: false for approximate "none" (erf), true for "tanh"; any other fails.
bool gelu_is_tanh(KernelContext& ctx) {
  std::string approx = ctx.node().attr_string("approximate", "none");
  if (approx != "none" && approx != "tanh")
    ctx.fail("approximate must be 'none' or 'tanh', not '" + approx + "'");
  return approx == "tanh";
}

// Elementwise dX = f(dY, A) over same-shaped inputs.
template <typename F>
void binary_same(KernelContext& ctx, F f) {
  const Tensor& dy = ctx.input(0);
  const Tensor& a = ctx.input(1);
  if (dy.shape() != a.shape()) ctx.fail("inputs must have the same shape");
  Tensor& dx = ctx.allocate_output(0, F32, dy.shape());
  const float* g = dy.data<float>();
  const float* pa = a.data<float>();
  float* o = dx.data<float>();
  parallel_for(ctx, dy.numel(), 4, [&](int64_t lo, int64_t hi) {
    int64_t i = lo;
    for (; i + 8 <= hi; i += 8) vec::store(o + i, f(vec::load(g + i), vec::load(pa + i)));
    for (; i < hi; ++i) o[i] = f(g[i], pa[i]);
  });
}

const bool registered = [] {
  // Elementwise kernels read each element before writing the same index: they may run in place.
  const InPlaceRule first = in_place({{0, 0}});
  const InPlaceRule either = in_place({{0, 0}, {0, 1}});
  register_kernel("", "Add", {F32, I64, I32}, binary_op<AddOp, false>, 0, either);
  register_kernel("", "Sub", {F32, I64, I32}, binary_op<SubOp, false>, 0, either);
  register_kernel("", "Mul", {F32, I64, I32}, binary_op<MulOp, false>, 0, either);
  register_kernel("", "Div", {F32, I64, I32}, binary_op<DivOp, false>, 0, either);
  register_kernel("", "Pow", {F32}, pow_kernel);
  register_kernel("", "Min", {F32, I64, I32}, binary_op<MinOp, false>, 0, either);
  register_kernel("", "Max", {F32, I64, I32}, binary_op<MaxOp, false>, 0, either);
  register_kernel("", "Mod", {I64, I32}, mod_kernel);
  register_kernel("", "And", {BOOL}, logical<true>);
  register_kernel("", "Or", {BOOL}, logical<false>);
  register_kernel("", "Clip", {F32, I64, I32}, clip);
  register_kernel(
      "", "Cos", {F32},
      [](KernelContext& ctx) { unary_f32(ctx, 8, [](float x) { return std::cos(x); }); }, 0, first);
  register_kernel(
      "", "Sin", {F32},
      [](KernelContext& ctx) { unary_f32(ctx, 8, [](float x) { return std::sin(x); }); }, 0, first);
  register_kernel("", "Equal", {F32, I64, I32, BOOL}, binary_op<EqOp, true>);
  register_kernel("", "Less", {F32, I64, I32}, binary_op<LtOp, true>);
  register_kernel("", "Greater", {F32, I64, I32}, binary_op<GtOp, true>);
  register_kernel("", "LessOrEqual", {F32, I64, I32}, binary_op<LeOp, true>);
  register_kernel("", "GreaterOrEqual", {F32, I64, I32}, binary_op<GeOp, true>);
  register_kernel("", "Where", {}, where_kernel, 1);
  register_kernel("", "Cast", {}, cast_kernel);
  register_kernel("", "Not", {BOOL},
                  [](KernelContext& ctx) { unary_typed<bool>(ctx, [](bool b) { return !b; }); });
  register_kernel(
      "", "Sqrt", {F32},
      [](KernelContext& ctx) { unary_f32(ctx, 2, [](float x) { return std::sqrt(x); }); }, 0,
      first);
  register_kernel(
      "", "Reciprocal", {F32},
      [](KernelContext& ctx) { unary_f32(ctx, 2, [](float x) { return 1.0f / x; }); }, 0, first);
  register_kernel(
      "", "Exp", {F32}, [](KernelContext& ctx) { apply_vec_op(ctx, 2, VecOp::kExp); }, 0, first);
  register_kernel(
      "", "Log", {F32},
      [](KernelContext& ctx) { unary_f32(ctx, 8, [](float x) { return std::log(x); }); }, 0, first);
  register_kernel(
      "", "Floor", {F32},
      [](KernelContext& ctx) { unary_f32(ctx, 1, [](float x) { return std::floor(x); }); }, 0,
      first);
  register_kernel(
      "", "Ceil", {F32},
      [](KernelContext& ctx) { unary_f32(ctx, 1, [](float x) { return std::ceil(x); }); }, 0,
      first);
  // Round: halves to even, as torch.round and ONNX (nearbyint in the default rounding mode).
  register_kernel(
      "", "Round", {F32},
      [](KernelContext& ctx) { unary_f32(ctx, 1, [](float x) { return std::nearbyint(x); }); }, 0,
      first);
  // log(1 + x) and e^x - 1 (torch's log1p, expm1): exact near 0, where 1 + x and e^x round.
  register_kernel(
      kGraphtrainDomain, "Log1p", {F32},
      [](KernelContext& ctx) { unary_f32(ctx, 8, [](float x) { return std::log1p(x); }); }, 0,
      first);
  register_kernel(
      kGraphtrainDomain, "Expm1", {F32},
      [](KernelContext& ctx) { unary_f32(ctx, 8, [](float x) { return std::expm1(x); }); }, 0,
      first);
  // log(1 + e^x) as max(x, 0) + log1p(e^-|x|): no overflow, and full precision far below 0.
  register_kernel(
      "", "Softplus", {F32},
      [](KernelContext& ctx) {
        unary_f32(ctx, 8,
                  [](float x) { return std::max(x, 0.0f) + std::log1p(std::exp(-std::fabs(x))); });
      },
      0, first);
  register_kernel(
      "", "Tanh", {F32}, [](KernelContext& ctx) { apply_vec_op(ctx, 3, VecOp::kTanh); }, 0, first);
  register_kernel(
      "", "Erf", {F32}, [](KernelContext& ctx) { apply_vec_op(ctx, 3, VecOp::kErf); }, 0, first);
  register_kernel(
      "", "Sigmoid", {F32}, [](KernelContext& ctx) { apply_vec_op(ctx, 2, VecOp::kSigmoid); }, 0,
      first);
  register_kernel(
      "", "Relu", {F32}, [](KernelContext& ctx) { unary_vec(ctx, 1, math::relu); }, 0, first);
  register_kernel(
      "", "LeakyRelu", {F32},
      [](KernelContext& ctx) {
        float alpha = ctx.node().attr_float("alpha", 0.01f);
        unary_f32(ctx, 1, [alpha](float x) { return x >= 0 ? x : alpha * x; });
      },
      0, first);
  register_kernel(
      "", "Gelu", {F32},
      [](KernelContext& ctx) {
        apply_vec_op(ctx, 4, gelu_is_tanh(ctx) ? VecOp::kGeluTanh : VecOp::kGelu);
      },
      0, first);
  // graphtrain::Gelu (pass stash_gelu_derivative): ONNX's Gelu, and where the backward asks for
  // it, the derivative at X (output 1) from the same exponential: its gradient is dY * output 1.
  register_kernel(
      GT, "Gelu", {F32},
      [](KernelContext& ctx) {
        const bool tanh = gelu_is_tanh(ctx);
        if (!ctx.output_requested(1))
          return apply_vec_op(ctx, 4, tanh ? VecOp::kGeluTanh : VecOp::kGelu);
        const Tensor& x = ctx.input(0);
        Tensor& y = ctx.allocate_output(0, F32, x.shape());
        Tensor& d = ctx.allocate_output(1, F32, x.shape());
        const float* px = x.data<float>();
        float *py = y.data<float>(), *pd = d.data<float>();
        parallel_for(ctx, x.numel(), 5, [&](int64_t lo, int64_t hi) {
          vec_gelu_with_derivative(tanh, px + lo, nullptr, nullptr, py + lo, pd + lo, hi - lo);
        });
      },
      0, first);
  // graphtrain::SiluMul(G, [U]) = silu(G) * U (pass recognize_silu_mul: a SwiGLU MLP's gate and
  // up projections; without U a bare SiLU), and its gradient SiluMulGrad(dY, G, [U]) -> (dG, dU)
  // in one pass, the sigmoid computed again from G: the forward stashes neither the sigmoid nor
  // silu(G).
  register_kernel(GT, "SiluMul", {F32}, [](KernelContext& ctx) {
    apply_vec_op(ctx, 5, ctx.has_input(1) ? VecOp::kSiluMul : VecOp::kSilu);
  });
  register_kernel(GT, "SiluMulGrad", {F32}, [](KernelContext& ctx) {
    const Tensor& dy = ctx.input(0);
    const Tensor& g = ctx.input(1);
    const Tensor* u = ctx.has_input(2) ? &ctx.input(2) : nullptr;
    if (g.shape() != dy.shape() || (u && u->shape() != dy.shape()))
      ctx.fail("dY, G and U must have the same shape, got " + dy.describe() + ", " + g.describe() +
               (u ? " and " + u->describe() : std::string()));
    float* dg =
        ctx.output_requested(0) ? ctx.allocate_output(0, F32, g.shape()).data<float>() : nullptr;
    float* du = u && ctx.output_requested(1) ? ctx.allocate_output(1, F32, u->shape()).data<float>()
                                             : nullptr;
    if (!u && !dg) return;
    const float *pd = dy.data<float>(), *pg = g.data<float>(), *pu = u ? u->data<float>() : nullptr;
    parallel_for(ctx, dy.numel(), 6, [&](int64_t lo, int64_t hi) {
      vec_silu_mul_grad(pd + lo, pg + lo, pu ? pu + lo : nullptr, dg ? dg + lo : nullptr,
                        du ? du + lo : nullptr, hi - lo);
    });
  });
  register_kernel(
      "", "Neg", {F32, I64, I32},
      [](KernelContext& ctx) {
        switch (ctx.input(0).dtype()) {
          case F32:
            return unary_typed<float>(ctx, [](float x) { return -x; });
          case I64:
            return unary_typed<int64_t>(ctx, [](int64_t x) { return -x; });
          default:
            return unary_typed<int32_t>(ctx, [](int32_t x) { return -x; });
        }
      },
      0, first);
  register_kernel(
      "", "Abs", {F32, I64, I32},
      [](KernelContext& ctx) {
        switch (ctx.input(0).dtype()) {
          case F32:
            return unary_typed<float>(ctx, [](float x) { return std::fabs(x); });
          case I64:
            return unary_typed<int64_t>(ctx, [](int64_t x) { return x < 0 ? -x : x; });
          default:
            return unary_typed<int32_t>(ctx, [](int32_t x) { return x < 0 ? -x : x; });
        }
      },
      0, first);
  register_kernel("", "Identity", {}, [](KernelContext& ctx) { ctx.set_output(0, ctx.input(0)); });
  register_kernel(kGraphtrainDomain, "StopGradient", {},
                  [](KernelContext& ctx) { ctx.set_output(0, ctx.input(0)); });
  register_kernel(
      "", "Sign", {F32},
      [](KernelContext& ctx) {
        unary_f32(ctx, 1,
                  [](float x) { return x > 0 ? 1.0f : (x < 0 ? -1.0f : (x == x ? 0.0f : x)); });
      },
      0, first);
  register_kernel(
      GT, "ReluGrad", {F32}, [](KernelContext& ctx) { binary_same(ctx, math::relu_grad); }, 0,
      either);
  register_kernel(
      GT, "SigmoidGrad", {F32}, [](KernelContext& ctx) { binary_same(ctx, math::sigmoid_grad); }, 0,
      either);
  register_kernel(
      GT, "TanhGrad", {F32}, [](KernelContext& ctx) { binary_same(ctx, math::tanh_grad); }, 0,
      either);
  register_kernel(
      GT, "LeakyReluGrad", {F32},
      [](KernelContext& ctx) {
        float alpha = ctx.node().attr_float("alpha", 0.01f);
        binary_same(ctx, [alpha](auto g, auto x) { return x > 0.0f ? g : g * alpha; });
      },
      0, either);
  register_kernel(
      GT, "GeluGrad", {F32},
      [](KernelContext& ctx) {
        bool tanh = ctx.node().attr_string("approximate", "none") == "tanh";
        if (!ctx.has_input(2))
          return apply_vec_op(ctx, 4, tanh ? VecOp::kGeluTanhGrad : VecOp::kGeluGrad);
        // (dY, X, Y = GELU(X)): gelu_grad_from_output.
        const Tensor& dy = ctx.input(0);
        if (ctx.input(1).shape() != dy.shape() || ctx.input(2).shape() != dy.shape())
          ctx.fail("inputs must have the same shape");
        Tensor& out = ctx.allocate_output(0, F32, dy.shape());
        const float* pg = dy.data<float>();
        const float* px = ctx.input(1).data<float>();
        const float* py = ctx.input(2).data<float>();
        float* po = out.data<float>();
        parallel_for(ctx, dy.numel(), 3, [&](int64_t lo, int64_t hi) {
          vec_gelu_grad_from_output(tanh, pg + lo, px + lo, py + lo, po + lo, hi - lo);
        });
      },
      0, either);
  return true;
}();

}  // namespace
}  // namespace graphtrain::cpu
