// CPU kernels: ONNX's random generators RandomUniformLike, RandomNormalLike and Bernoulli (torch's
// rand, randn and bernoulli, as in drop path). Values come from the counter-based generator of
// random.h: a hash of the node's seed, the call number and the element index, so they do not
// depend on how the work is split across threads, and every call draws new values.
#include <cmath>

#include "kernels/cpu/common.h"
#include "kernels/cpu/random.h"

namespace graphtrain::cpu {
namespace {

// Uniform in [0, 1) with as many random bits as T's mantissa holds (24 or 53).
template <typename T>
T uniform_of(uint64_t key, uint64_t index) {
  if constexpr (sizeof(T) == 4) {
    return uniform(key, index);
  } else {
    return static_cast<double>(mix(key ^ mix(index)) >> 11) * (1.0 / 9007199254740992.0);
  }
}

enum class Draw { kUniform, kNormal, kBernoulli };

class RandomKernel : public OpKernel {
 public:
  RandomKernel(const Node& node, Draw draw) : draw_(draw) {
    // ONNX's seed is a float; any value fixes the sequence. Without one, each node draws its own.
    seed_ = node.has_attr("seed")
                ? mix(static_cast<uint64_t>(static_cast<int64_t>(node.attr_float("seed", 0.0f))))
                : fresh_seed();
    if (draw == Draw::kNormal) {
      a_ = node.attr_float("mean", 0.0f);
      b_ = node.attr_float("scale", 1.0f);
    } else if (draw == Draw::kUniform) {
      a_ = node.attr_float("low", 0.0f);
      b_ = node.attr_float("high", 1.0f);
    }
  }

  void compute(KernelContext& ctx) override {
    const Tensor& x = ctx.input(0);
    if (draw_ == Draw::kBernoulli && x.dtype() != DType::kFloat32 && x.dtype() != DType::kFloat64)
      ctx.fail(str_cat("takes float32 or float64 probabilities, not ", to_string(x.dtype())));
    DType dtype = x.dtype();
    if (ctx.node().has_attr("dtype"))
      dtype = from_onnx(static_cast<int>(ctx.node().attr_int("dtype", 0)));
    Tensor& y = ctx.allocate_output(0, dtype, x.shape());
    uint64_t key = mix(seed_ ^ mix(calls_++));
    if (dtype == DType::kFloat32) {
      fill<float>(ctx, x, y, key);
    } else if (dtype == DType::kFloat64) {
      fill<double>(ctx, x, y, key);
    } else {
      ctx.fail(str_cat("draws float32 or float64 values, not ", to_string(dtype),
                       "; set the dtype attribute to FLOAT or DOUBLE"));
    }
  }

 private:
  template <typename T>
  void fill(KernelContext& ctx, const Tensor& x, Tensor& y, uint64_t key) const {
    T* out = y.data<T>();
    T a = static_cast<T>(a_), b = static_cast<T>(b_);
    switch (draw_) {
      case Draw::kUniform:
        parallel_for(ctx, y.numel(), 4, [&](int64_t lo, int64_t hi) {
          for (int64_t i = lo; i < hi; ++i) out[i] = a + (b - a) * uniform_of<T>(key, i);
        });
        break;
      case Draw::kNormal:  // Box-Muller on two uniforms of the element's own counters
        parallel_for(ctx, y.numel(), 16, [&](int64_t lo, int64_t hi) {
          for (int64_t i = lo; i < hi; ++i) {
            T u1 = T(1) - uniform_of<T>(key, 2 * static_cast<uint64_t>(i));  // in (0, 1]
            T u2 = uniform_of<T>(key, 2 * static_cast<uint64_t>(i) + 1);
            out[i] =
                a + b * std::sqrt(T(-2) * std::log(u1)) * std::cos(T(6.283185307179586476925) * u2);
          }
        });
        break;
      case Draw::kBernoulli: {  // 1 with the input's probability
        auto draw = [&](auto* p) {
          parallel_for(ctx, y.numel(), 4, [&](int64_t lo, int64_t hi) {
            for (int64_t i = lo; i < hi; ++i)
              out[i] = uniform_of<T>(key, i) < static_cast<T>(p[i]) ? T(1) : T(0);
          });
        };
        if (x.dtype() == DType::kFloat32)
          draw(x.data<float>());
        else
          draw(x.data<double>());
        break;
      }
    }
  }

  Draw draw_;
  uint64_t seed_ = 0;
  uint64_t calls_ = 0;
  float a_ = 0.0f, b_ = 1.0f;
};

const bool registered = [] {
  for (auto [op, draw] :
       {std::pair{"RandomUniformLike", Draw::kUniform},
        std::pair{"RandomNormalLike", Draw::kNormal}, std::pair{"Bernoulli", Draw::kBernoulli}})
    register_stateful_kernel("", op, {}, [draw = draw](const Node& n) {
      return std::make_unique<RandomKernel>(n, draw);
    });
  return true;
}();

}  // namespace
}  // namespace graphtrain::cpu
