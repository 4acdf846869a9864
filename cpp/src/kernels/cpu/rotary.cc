// CPU kernel: graphtrain::Rotary(X, Cos, Sin) -> Y, the rotary position embedding as transformers'
// Llama family applies it, X * Cos + rotate_half(X) * Sin, with rotate_half(X) = concat(-X2, X1)
// for X's last dim split in halves X1, X2 (Cos and Sin alike):
//   Y1 = X1 Cos1 - X2 Sin1,  Y2 = X2 Cos2 + X1 Sin2.
// With inverse=1 the rotation is transposed (the gradient: dX = dY Cos + rotate_half^T(dY Sin)):
//   Y1 = X1 Cos1 + X2 Sin2,  Y2 = X2 Cos2 - X1 Sin1.
// Cos and Sin have X's last dim and broadcast to X's shape (Llama's [B, 1, T, D] against the
// heads' [B, H, T, D]).
#include "kernels/cpu/common.h"
#include "kernels/cpu/vec_math.h"

namespace graphtrain::cpu {
namespace {

void rotary(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const Tensor& c = ctx.input(1);
  const Tensor& s = ctx.input(2);
  for (const Tensor* t : {&x, &c, &s})
    if (t->dtype() != F32 || t->rank() == 0)
      ctx.fail("X, Cos and Sin must be float32 tensors of rank 1 or more, got " + t->describe());
  const int64_t d = x.shape().back(), half = d / 2;
  if (d % 2 != 0 || c.shape().back() != d || s.shape().back() != d)
    ctx.fail(str_cat("X's last dim must be even and equal Cos's and Sin's, got ", x.shape(), ", ",
                     c.shape(), " and ", s.shape()));
  Broadcaster bc(ctx, {&x.shape(), &c.shape(), &s.shape()});
  if (bc.out_shape() != x.shape())
    ctx.fail(str_cat("Cos ", c.shape(), " and Sin ", s.shape(), " must broadcast to X's shape ",
                     x.shape()));
  Tensor& y = ctx.allocate_output(0, F32, x.shape());
  if (x.numel() == 0) return;
  // The last dim is never broadcast, so each broadcast row is whole vectors of d, read in order.
  const int64_t inner = bc.inner();
  const bool inverse = ctx.node().attr_int("inverse", 0) != 0;
  const float* px = x.data<float>();
  const float* pc = c.data<float>();
  const float* ps = s.data<float>();
  float* py = y.data<float>();
  parallel_for(ctx, bc.rows(), inner * 2, [&](int64_t lo, int64_t hi) {
    int64_t off[3];
    for (int64_t row = lo; row < hi; ++row) {
      bc.offsets(row, off);
      for (int64_t at = 0; at < inner; at += d) {
        const float* x1 = px + off[0] + at;
        const float* c1 = pc + off[1] + at;
        const float* s1 = ps + off[2] + at;
        const float *x2 = x1 + half, *c2 = c1 + half, *s2 = s1 + half;
        float* y1 = py + row * inner + at;
        float* y2 = y1 + half;
        // Eight lanes at a time (the halves of a head are 32 or 64 wide), then the rest.
        int64_t i = 0;
        for (; i + 8 <= half; i += 8) {
          vec::f8 a = vec::load(x1 + i), b = vec::load(x2 + i);
          vec::f8 sa = vec::load(s1 + i), sb = vec::load(s2 + i);
          vec::f8 ya = a * vec::load(c1 + i), yb = b * vec::load(c2 + i);
          vec::store(y1 + i, inverse ? ya + b * sb : ya - b * sa);
          vec::store(y2 + i, inverse ? yb - a * sa : yb + a * sb);
        }
        for (; i < half; ++i) {
          float a = x1[i], b = x2[i];
          y1[i] = inverse ? a * c1[i] + b * s2[i] : a * c1[i] - b * s1[i];
          y2[i] = inverse ? b * c2[i] - a * s1[i] : b * c2[i] + a * s2[i];
        }
      }
    }
  });
}

const bool registered = [] {
  register_kernel(GT, "Rotary", {F32}, rotary);
  return true;
}();

}  // namespace
}  // namespace graphtrain::cpu
