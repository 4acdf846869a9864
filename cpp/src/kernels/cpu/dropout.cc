// CPU kernels: Dropout and DropoutGrad. The mask comes from a counter-based generator (a hash of
// seed, call number and element index), so it does not depend on how the work is split across
// threads.
#include "kernels/cpu/common.h"
#include "kernels/cpu/random.h"

namespace graphtrain::cpu {
namespace {

class DropoutKernel : public OpKernel {
 public:
  explicit DropoutKernel(const Node& node) {
    if (node.has_attr("seed")) {
      seed_ = static_cast<uint64_t>(node.attr_int("seed", 0));
    } else {
      seed_ = fresh_seed();
    }
  }

  void compute(KernelContext& ctx) override {
    const Tensor& x = ctx.input(0);
    float ratio = ctx.has_input(1) ? ctx.input(1).data<float>()[0] : 0.5f;
    bool training = ctx.has_input(2) && ctx.input(2).data<bool>()[0];
    if (!(ratio >= 0.0f && ratio <= 1.0f))
      ctx.fail(str_cat("ratio must be in [0, 1], got ", ratio));
    bool* mask = ctx.output_requested(1)
                     ? ctx.allocate_output(1, DType::kBool, x.shape()).data<bool>()
                     : nullptr;
    if (!training || ratio == 0.0f) {
      ctx.set_output(0, x);
      if (mask) std::fill(mask, mask + x.numel(), true);
      return;
    }
    Tensor& y = ctx.allocate_output(0, x.dtype(), x.shape());
    const float* px = x.data<float>();
    float* py = y.data<float>();
    float scale = ratio < 1.0f ? 1.0f / (1.0f - ratio) : 0.0f;
    uint64_t key = mix(seed_ ^ mix(calls_++));
    parallel_for(ctx, x.numel(), 4, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) {
        bool keep = uniform(key, static_cast<uint64_t>(i)) >= ratio;
        py[i] = keep ? px[i] * scale : 0.0f;
        if (mask) mask[i] = keep;
      }
    });
  }

 private:
  uint64_t seed_ = 0;
  uint64_t calls_ = 0;
};

void dropout_grad(KernelContext& ctx) {
  const Tensor& dy = ctx.input(0);
  const Tensor& mask = ctx.input(1);
  float ratio = ctx.has_input(2) ? ctx.input(2).data<float>()[0] : 0.5f;
  bool training = ctx.has_input(3) && ctx.input(3).data<bool>()[0];
  if (!training || ratio == 0.0f) {
    ctx.set_output(0, dy);
    return;
  }
  float scale = ratio < 1.0f ? 1.0f / (1.0f - ratio) : 0.0f;
  Tensor& dx = ctx.allocate_output(0, F32, dy.shape());
  const float* g = dy.data<float>();
  const bool* m = mask.data<bool>();
  float* o = dx.data<float>();
  parallel_for(ctx, dy.numel(), 1, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) o[i] = m[i] ? g[i] * scale : 0.0f;
  });
}

const bool registered = [] {
  register_stateful_kernel("", "Dropout", {DType::kFloat32},
                           [](const Node& n) { return std::make_unique<DropoutKernel>(n); });
  register_kernel(GT, "DropoutGrad", {F32}, dropout_grad);
  return true;
}();

}  // namespace
}  // namespace graphtrain::cpu
