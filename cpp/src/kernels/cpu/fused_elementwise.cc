// graphtrain::FusedElementwise: a chain of float elementwise ops (made by the fuse_elementwise
// pass) run as one loop over the data. The node carries a small program:
//   registers: the inputs (broadcast to the output shape), then `constants`, then one per
//   instruction (instruction k writes register inputs + constants + k);
//   `ops` (one op name per instruction), `args` (three register indices per instruction, -1 when
//   unused), `outputs` (the register each output holds), `bool_outputs` (the outputs that are bool
//   tensors, optional).
// Comparisons and logic (Less, Greater, LessOrEqual, GreaterOrEqual, Equal, And, Or, Not) write
// registers of 1s and 0s, which Where reads as its condition; bool inputs are read as 1 and 0, and
// bool outputs written from such registers.
// The data is walked in blocks of kBlock elements; each instruction runs over a block at a time,
// so intermediates stay in the cache and only the outputs are written to memory.
#include <cmath>
#include <cstring>
#include <vector>

#include "graphtrain/error.h"
#include "kernels/cpu/common.h"
#include "kernels/cpu/elementwise_math.h"
#include "kernels/cpu/vec_dispatch.h"

namespace graphtrain::cpu {
namespace {

constexpr int64_t kBlock = 512;

enum class Code {
  kAdd,
  kSub,
  kMul,
  kDiv,
  kMax,
  kMin,
  kPow,
  kNeg,
  kAbs,
  kSqrt,
  kReciprocal,
  kExp,
  kLog,
  kTanh,
  kErf,
  kSigmoid,
  kRelu,
  kLeakyRelu,
  kGelu,
  kGeluTanh,
  kGeluDerivative,
  kGeluTanhDerivative,
  kSin,
  kCos,
  kReluGrad,
  kSigmoidGrad,
  kTanhGrad,
  kLeakyReluGrad,
  kGeluGrad,
  kGeluTanhGrad,
  kLess,
  kGreater,
  kLessOrEqual,
  kGreaterOrEqual,
  kEqual,
  kAnd,
  kOr,
  kNot,
  kWhere,
  kClip
};

struct OpName {
  const char* name;
  Code code;
  int arity;
};

// Every op a program may hold: the op names of fuse_elementwise (passes/fuse_elementwise.cc).
constexpr OpName kOps[] = {
    {"Add", Code::kAdd, 2},
    {"Sub", Code::kSub, 2},
    {"Mul", Code::kMul, 2},
    {"Div", Code::kDiv, 2},
    {"Max", Code::kMax, 2},
    {"Min", Code::kMin, 2},
    {"Pow", Code::kPow, 2},
    {"Neg", Code::kNeg, 1},
    {"Abs", Code::kAbs, 1},
    {"Sqrt", Code::kSqrt, 1},
    {"Reciprocal", Code::kReciprocal, 1},
    {"Exp", Code::kExp, 1},
    {"Log", Code::kLog, 1},
    {"Tanh", Code::kTanh, 1},
    {"Erf", Code::kErf, 1},
    {"Sigmoid", Code::kSigmoid, 1},
    {"Relu", Code::kRelu, 1},
    {"LeakyRelu", Code::kLeakyRelu, 2},  // x, alpha
    {"Gelu", Code::kGelu, 1},
    {"GeluTanh", Code::kGeluTanh, 1},
    {"GeluDerivative", Code::kGeluDerivative, 1},  // graphtrain::Gelu's output 1
    {"GeluTanhDerivative", Code::kGeluTanhDerivative, 1},
    {"Sin", Code::kSin, 1},
    {"Cos", Code::kCos, 1},
    {"ReluGrad", Code::kReluGrad, 2},
    {"SigmoidGrad", Code::kSigmoidGrad, 2},
    {"TanhGrad", Code::kTanhGrad, 2},
    {"LeakyReluGrad", Code::kLeakyReluGrad, 3},  // dy, x, alpha
    {"GeluGrad", Code::kGeluGrad, 2},
    {"GeluTanhGrad", Code::kGeluTanhGrad, 2},
    {"Less", Code::kLess, 2},
    {"Greater", Code::kGreater, 2},
    {"LessOrEqual", Code::kLessOrEqual, 2},
    {"GreaterOrEqual", Code::kGreaterOrEqual, 2},
    {"Equal", Code::kEqual, 2},
    {"And", Code::kAnd, 2},
    {"Or", Code::kOr, 2},
    {"Not", Code::kNot, 1},
    {"Where", Code::kWhere, 3},  // condition, x, y
    {"Clip", Code::kClip, 3},    // x, min, max
};

template <typename F>
inline void map2(const float* a, const float* b, float* d, int64_t n, F f) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) vec::store(d + i, f(vec::load(a + i), vec::load(b + i)));
  for (; i < n; ++i) d[i] = f(a[i], b[i]);
}

template <typename F>
inline void map3(const float* a, const float* b, const float* c, float* d, int64_t n, F f) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    vec::store(d + i, f(vec::load(a + i), vec::load(b + i), vec::load(c + i)));
  for (; i < n; ++i) d[i] = f(a[i], b[i], c[i]);
}

// 1 where the comparison holds, else 0, for a float or a vector of them.
template <typename T, typename M>
inline T one_where(M holds) {
  return holds ? T{} + 1.0f : T{};
}

template <typename F>
inline void scalar1(const float* a, float* d, int64_t n, F f) {
  for (int64_t i = 0; i < n; ++i) d[i] = f(a[i]);
}

// Instructions that run as one pass over a block, at the first of them.
enum class Joint {
  kNone,
  kAddGelu,            // Add, then a GELU (erf form) of the sum: vec_add_apply
  kAddGeluDerivative,  // Add, then a GELU of the sum and its derivative: vec_gelu_with_derivative
  kGeluDerivative,     // a GELU and its derivative of one register: vec_gelu_with_derivative
};

struct Instr {
  Code code;
  int a, b, c;
  float exponent = 0;  // kPow: the constant exponent
  Joint joint = Joint::kNone;
  bool tanh = false;        // a joint GELU's form
  bool sum_written = true;  // kAddGeluDerivative: the sum's register is read after the pass
};

bool is_gelu(Code c) {
  return c == Code::kGelu || c == Code::kGeluTanh;
}
bool is_derivative_of(Code d, Code gelu) {
  return (gelu == Code::kGelu && d == Code::kGeluDerivative) ||
         (gelu == Code::kGeluTanh && d == Code::kGeluTanhDerivative);
}

class FusedElementwise : public OpKernel {
 public:
  explicit FusedElementwise(const Node& node) {
    std::vector<std::string> ops = node.attr("ops", Attribute::Kind::kStrings).strings;
    std::vector<int64_t> args = node.attr_ints("args");
    constants_ = node.has_attr("constants") ? node.attr_floats("constants") : std::vector<float>{};
    outputs_ = node.attr_ints("outputs");
    n_inputs_ = static_cast<int>(node.inputs().size());
    int n_const = static_cast<int>(constants_.size());
    int n_regs = n_inputs_ + n_const + static_cast<int>(ops.size());
    auto fail = [&](const std::string& why) {
      throw GraphError(node.describe() + ": bad fused program: " + why);
    };
    if (args.size() != 3 * ops.size())
      fail(str_cat(ops.size(), " ops need ", 3 * ops.size(), " args, got ", args.size()));
    for (size_t k = 0; k < ops.size(); ++k) {
      const OpName* op = nullptr;
      for (const OpName& o : kOps)
        if (ops[k] == o.name) op = &o;
      if (!op) fail("unknown op '" + ops[k] + "'");
      Instr in{op->code, static_cast<int>(args[3 * k]), static_cast<int>(args[3 * k + 1]),
               static_cast<int>(args[3 * k + 2])};
      int self = n_inputs_ + n_const + static_cast<int>(k);
      int used[3] = {in.a, in.b, in.c};
      for (int j = 0; j < 3; ++j) {
        if ((j < op->arity) != (used[j] >= 0) || used[j] >= self)
          fail(str_cat("op ", k, " (", ops[k], ") reads register ", used[j]));
      }
      if (op->code == Code::kPow) {
        if (in.b < n_inputs_ || in.b >= n_inputs_ + n_const) fail("Pow needs a constant exponent");
        in.exponent = constants_[static_cast<size_t>(in.b - n_inputs_)];
      }
      program_.push_back(in);
    }
    for (int64_t r : outputs_)
      if (r < 0 || r >= n_regs) fail(str_cat("output register ", r));
    join_gelus(n_inputs_ + n_const);
    bool_output_.assign(outputs_.size(), false);
    if (node.has_attr("bool_outputs"))
      for (int64_t o : node.attr_ints("bool_outputs")) {
        if (o < 0 || o >= static_cast<int64_t>(outputs_.size())) fail(str_cat("bool output ", o));
        bool_output_[static_cast<size_t>(o)] = true;
      }
    // Constant registers: blocks of the value, read like any input.
    const_blocks_.resize(constants_.size() * kBlock);
    for (size_t c = 0; c < constants_.size(); ++c)
      std::fill_n(const_blocks_.data() + c * kBlock, kBlock, constants_[c]);
  }

  void compute(KernelContext& ctx) override {
    std::vector<const Shape*> shapes;
    std::vector<const void*> in_data;
    std::vector<bool> in_bool;
    for (int i = 0; i < n_inputs_; ++i) {
      const Tensor& t = ctx.input(static_cast<size_t>(i));
      if (t.dtype() != F32 && t.dtype() != DType::kBool)
        ctx.fail(str_cat("input ", i, " must be float32 or bool, got ", t.describe()));
      shapes.push_back(&t.shape());
      in_data.push_back(t.raw_data());
      in_bool.push_back(t.dtype() == DType::kBool);
    }
    Broadcaster bc(ctx, shapes);
    std::vector<void*> out_data;
    for (size_t o = 0; o < outputs_.size(); ++o)
      out_data.push_back(
          ctx.allocate_output(o, bool_output_[o] ? DType::kBool : F32, bc.out_shape()).raw_data());
    const int64_t inner = bc.inner();
    const int64_t per_row = (inner + kBlock - 1) / kBlock;
    const int64_t items = bc.rows() * per_row;
    const int n_const = static_cast<int>(constants_.size());
    const int n_regs = n_inputs_ + n_const + static_cast<int>(program_.size());
    // Output register -> float output index (the instruction writes straight into the output).
    std::vector<int> out_of(static_cast<size_t>(n_regs), -1);
    for (size_t o = 0; o < outputs_.size(); ++o)
      if (!bool_output_[o]) out_of[static_cast<size_t>(outputs_[o])] = int(o);
    const int64_t cost = static_cast<int64_t>(program_.size()) * 2;

    parallel_for(ctx, items, kBlock * cost, [&](int64_t lo, int64_t hi) {
      thread_local std::vector<float> scratch;
      scratch.resize(static_cast<size_t>(n_regs) * kBlock);
      std::vector<const float*> reg(static_cast<size_t>(n_regs));
      std::vector<float*> dst(static_cast<size_t>(n_regs));
      std::vector<int64_t> off(static_cast<size_t>(n_inputs_) + 1);
      for (int c = 0; c < n_const; ++c)
        reg[static_cast<size_t>(n_inputs_ + c)] = const_blocks_.data() + c * kBlock;
      for (int64_t item = lo; item < hi; ++item) {
        int64_t row = item / per_row;
        int64_t start = (item % per_row) * kBlock;
        int64_t n = std::min(kBlock, inner - start);
        bc.offsets(row, off.data());
        for (int i = 0; i < n_inputs_; ++i) {
          const int64_t at = off[static_cast<size_t>(i)];
          if (in_bool[static_cast<size_t>(i)]) {  // read as 1s and 0s
            const bool* p = static_cast<const bool*>(in_data[static_cast<size_t>(i)]) + at;
            float* s = scratch.data() + static_cast<size_t>(i) * kBlock;
            if (bc.inner_stride(static_cast<size_t>(i)) == 1)
              for (int64_t q = 0; q < n; ++q) s[q] = p[start + q] ? 1.0f : 0.0f;
            else
              std::fill_n(s, n, p[0] ? 1.0f : 0.0f);
            reg[static_cast<size_t>(i)] = s;
            continue;
          }
          const float* p = static_cast<const float*>(in_data[static_cast<size_t>(i)]) + at;
          if (bc.inner_stride(static_cast<size_t>(i)) == 1) {
            reg[static_cast<size_t>(i)] = p + start;
            for (int64_t q = 0; q < n; q += 16) vec::prefetch(p + start + q);  // 2 blocks ahead
          } else {  // broadcast along the inner dim: one value for the block
            float* s = scratch.data() + static_cast<size_t>(i) * kBlock;
            std::fill_n(s, n, p[0]);
            reg[static_cast<size_t>(i)] = s;
          }
        }
        for (int r = n_inputs_ + n_const; r < n_regs; ++r) {
          int o = out_of[static_cast<size_t>(r)];
          dst[static_cast<size_t>(r)] =
              o >= 0 ? static_cast<float*>(out_data[static_cast<size_t>(o)]) + row * inner + start
                     : scratch.data() + static_cast<size_t>(r) * kBlock;
          reg[static_cast<size_t>(r)] = dst[static_cast<size_t>(r)];
        }
        for (size_t k = 0; k < program_.size(); ++k) {
          const Instr& in = program_[k];
          float* d = dst[static_cast<size_t>(n_inputs_ + n_const) + k];
          float* const* next = dst.data() + n_inputs_ + n_const + k + 1;  // the joint's others
          switch (in.joint) {
            case Joint::kAddGelu:
              vec_add_apply(VecOp::kGelu, reg[static_cast<size_t>(in.a)],
                            reg[static_cast<size_t>(in.b)], d, next[0], n);
              k += 1;
              continue;
            case Joint::kAddGeluDerivative:
              vec_gelu_with_derivative(in.tanh, reg[static_cast<size_t>(in.a)],
                                       reg[static_cast<size_t>(in.b)], in.sum_written ? d : nullptr,
                                       next[0], next[1], n);
              k += 2;
              continue;
            case Joint::kGeluDerivative:
              vec_gelu_with_derivative(in.tanh, reg[static_cast<size_t>(in.a)], nullptr, nullptr, d,
                                       next[0], n);
              k += 1;
              continue;
            case Joint::kNone:
              break;
          }
          run(in, reg[static_cast<size_t>(in.a)],
              in.b >= 0 ? reg[static_cast<size_t>(in.b)] : nullptr,
              in.c >= 0 ? reg[static_cast<size_t>(in.c)] : nullptr, d, n);
        }
        // A bool output is written from its register; an output that is an input or a constant
        // register (a pass-through) is copied.
        for (size_t o = 0; o < outputs_.size(); ++o) {
          int r = static_cast<int>(outputs_[o]);
          const float* v = reg[static_cast<size_t>(r)];
          if (bool_output_[o]) {
            bool* out = static_cast<bool*>(out_data[o]) + row * inner + start;
            for (int64_t q = 0; q < n; ++q) out[q] = v[q] != 0.0f;
          } else if (r < n_inputs_ + n_const) {
            std::memcpy(static_cast<float*>(out_data[o]) + row * inner + start, v,
                        static_cast<size_t>(n) * sizeof(float));
          }
        }
      }
    });
  }

 private:
  // Marks the GELUs that run in one pass with the Add before them and / or their derivative
  // (instruction k writes register first + k).
  void join_gelus(int first) {
    std::vector<int> reads(static_cast<size_t>(first) + program_.size(), 0);
    for (const Instr& in : program_)
      for (int r : {in.a, in.b, in.c})
        if (r >= 0) ++reads[static_cast<size_t>(r)];
    for (int64_t r : outputs_) ++reads[static_cast<size_t>(r)];
    for (size_t k = 0; k < program_.size(); ++k) {
      Instr& in = program_[k];
      const int self = first + static_cast<int>(k);
      Instr* g = k + 1 < program_.size() ? &program_[k + 1] : nullptr;
      Instr* d = k + 2 < program_.size() ? &program_[k + 2] : nullptr;
      if (in.code == Code::kAdd && g && is_gelu(g->code) && g->a == self && d &&
          is_derivative_of(d->code, g->code) && d->a == self) {
        in.joint = Joint::kAddGeluDerivative;
        in.tanh = g->code == Code::kGeluTanh;
        in.sum_written = reads[static_cast<size_t>(self)] > 2;
        k += 2;
      } else if (in.code == Code::kAdd && g && g->code == Code::kGelu && g->a == self) {
        in.joint = Joint::kAddGelu;
        k += 1;
      } else if (is_gelu(in.code) && g && is_derivative_of(g->code, in.code) && g->a == in.a) {
        in.joint = Joint::kGeluDerivative;
        in.tanh = in.code == Code::kGeluTanh;
        k += 1;
      }
    }
  }

  static void run(const Instr& in, const float* a, const float* b, const float* c, float* d,
                  int64_t n) {
    switch (in.code) {
      case Code::kAdd:
        return map2(a, b, d, n, [](auto x, auto y) { return x + y; });
      case Code::kSub:
        return map2(a, b, d, n, [](auto x, auto y) { return x - y; });
      case Code::kMul:
        return map2(a, b, d, n, [](auto x, auto y) { return x * y; });
      case Code::kDiv:
        return map2(a, b, d, n, [](auto x, auto y) { return x / y; });
      case Code::kMax:
        return map2(a, b, d, n, [](auto x, auto y) { return x != x ? x : (y > x ? y : x); });
      case Code::kMin:
        return map2(a, b, d, n, [](auto x, auto y) { return x != x ? x : (y < x ? y : x); });
      case Code::kPow:
        if (in.exponent == 2.0f) return vec::map(a, d, n, [](auto x) { return x * x; });
        if (in.exponent == 3.0f) return vec::map(a, d, n, [](auto x) { return x * x * x; });
        return scalar1(a, d, n, [p = in.exponent](float x) { return math::pow_scalar(x, p); });
      case Code::kNeg:
        return vec::map(a, d, n, [](auto x) { return -x; });
      case Code::kAbs:
        return scalar1(a, d, n, [](float x) { return std::fabs(x); });
      case Code::kSqrt:
        return scalar1(a, d, n, [](float x) { return std::sqrt(x); });
      case Code::kReciprocal:
        return vec::map(a, d, n, [](auto x) { return 1.0f / x; });
      case Code::kExp:
        return vec_apply(VecOp::kExp, a, nullptr, d, n);
      case Code::kLog:
        return scalar1(a, d, n, [](float x) { return std::log(x); });
      case Code::kTanh:
        return vec_apply(VecOp::kTanh, a, nullptr, d, n);
      case Code::kErf:
        return vec_apply(VecOp::kErf, a, nullptr, d, n);
      case Code::kSigmoid:
        return vec_apply(VecOp::kSigmoid, a, nullptr, d, n);
      case Code::kRelu:
        return vec::map(a, d, n, math::relu);
      case Code::kLeakyRelu:
        return map2(a, b, d, n, [](auto x, auto alpha) { return x >= 0.0f ? x : alpha * x; });
      case Code::kGelu:
        return vec_apply(VecOp::kGelu, a, nullptr, d, n);
      case Code::kGeluTanh:
        return vec_apply(VecOp::kGeluTanh, a, nullptr, d, n);
      case Code::kGeluDerivative:
        return vec::map(a, d, n, [](auto x) { return math::gelu_erf_with_derivative(x).second; });
      case Code::kGeluTanhDerivative:
        return vec::map(a, d, n, [](auto x) { return math::gelu_tanh_with_derivative(x).second; });
      case Code::kSin:
        return scalar1(a, d, n, [](float x) { return std::sin(x); });
      case Code::kCos:
        return scalar1(a, d, n, [](float x) { return std::cos(x); });
      case Code::kReluGrad:
        return map2(a, b, d, n, math::relu_grad);
      case Code::kSigmoidGrad:
        return map2(a, b, d, n, math::sigmoid_grad);
      case Code::kTanhGrad:
        return map2(a, b, d, n, math::tanh_grad);
      case Code::kLeakyReluGrad:
        for (int64_t i = 0; i < n; ++i) d[i] = b[i] > 0.0f ? a[i] : a[i] * c[i];
        return;
      case Code::kGeluGrad:
        return vec_apply(VecOp::kGeluGrad, a, b, d, n);
      case Code::kGeluTanhGrad:
        return vec_apply(VecOp::kGeluTanhGrad, a, b, d, n);
      case Code::kLess:
        return map2(a, b, d, n, [](auto x, auto y) { return one_where<decltype(x)>(x < y); });
      case Code::kGreater:
        return map2(a, b, d, n, [](auto x, auto y) { return one_where<decltype(x)>(x > y); });
      case Code::kLessOrEqual:
        return map2(a, b, d, n, [](auto x, auto y) { return one_where<decltype(x)>(x <= y); });
      case Code::kGreaterOrEqual:
        return map2(a, b, d, n, [](auto x, auto y) { return one_where<decltype(x)>(x >= y); });
      case Code::kEqual:
        return map2(a, b, d, n, [](auto x, auto y) { return one_where<decltype(x)>(x == y); });
      case Code::kAnd:  // registers of 1s and 0s
        return map2(a, b, d, n, [](auto x, auto y) { return x * y; });
      case Code::kOr:
        return map2(a, b, d, n,
                    [](auto x, auto y) { return one_where<decltype(x)>(x + y > 0.0f); });
      case Code::kNot:
        return vec::map(a, d, n, [](auto x) { return 1.0f - x; });
      case Code::kWhere:
        return map3(a, b, c, d, n, [](auto m, auto x, auto y) { return m != 0.0f ? x : y; });
      case Code::kClip:  // the Clip kernel's: NaN passes through
        return map3(a, b, c, d, n,
                    [](auto x, auto lo, auto hi) { return x < lo ? lo : (x > hi ? hi : x); });
    }
  }

  int n_inputs_ = 0;
  std::vector<Instr> program_;
  std::vector<float> constants_;
  std::vector<float> const_blocks_;
  std::vector<int64_t> outputs_;
  std::vector<bool> bool_output_;  // per output
};

// Output o may be written over input i when the instruction that writes o is the last to read i
// (each block is read, then written, at the same indices) and i is not also passed through.
InPlacePairs fused_in_place(const Node& node) {
  std::vector<int64_t> args = node.attr_ints("args");
  std::vector<int64_t> outputs = node.attr_ints("outputs");
  const int64_t n_inputs = static_cast<int64_t>(node.inputs().size());
  const int64_t first_op =
      n_inputs +
      static_cast<int64_t>(node.has_attr("constants") ? node.attr_floats("constants").size() : 0);
  const int64_t n_ops = static_cast<int64_t>(args.size() / 3);
  std::vector<int64_t> last_read(static_cast<size_t>(n_inputs), -1);  // instruction
  for (int64_t k = 0; k < n_ops; ++k)
    for (int64_t j = 0; j < 3; ++j) {
      int64_t r = args[static_cast<size_t>(3 * k + j)];
      if (r >= 0 && r < n_inputs) last_read[static_cast<size_t>(r)] = k;
    }
  for (int64_t r : outputs)
    if (r >= 0 && r < n_inputs) last_read[static_cast<size_t>(r)] = n_ops;  // passed through
  InPlacePairs pairs;
  for (size_t o = 0; o < outputs.size(); ++o) {
    int64_t k = outputs[o] - first_op;
    if (k < 0 || k >= n_ops) continue;
    for (int64_t i = 0; i < n_inputs; ++i)
      if (last_read[static_cast<size_t>(i)] <= k) pairs.emplace_back(o, static_cast<size_t>(i));
  }
  return pairs;
}

const bool registered = [] {
  register_stateful_kernel(
      GT, "FusedElementwise", {F32, DType::kBool},
      [](const Node& node) { return std::make_unique<FusedElementwise>(node); }, fused_in_place);
  return true;
}();

}  // namespace
}  // namespace graphtrain::cpu
