// Convolution by oneDNN's direct (JIT, blocked-layout) kernels, where graphtrain is built with
// Debian's oneDNN: Conv and ConvGrad use it first and keep im2col + GEMM (conv.cc) for what it
// declines. Measured on hf-resnet's 3 x 3 layers at one thread: about twice im2col's speed,
// forward and backward (bench/results/conv.md).
#pragma once

#include <cstdint>

namespace graphtrain {
class ThreadPool;
}

namespace graphtrain::cpu {

// A 2-D convolution (1-D ones have height 1): NCHW input, (M, C / group, kh, kw) weights.
struct ConvShape {
  int64_t n, c, h, w, m, group;
  int64_t kh, kw, sh, sw, dh, dw;  // kernel, strides, dilations (1: none)
  int64_t ph0, pw0, ph1, pw1;      // pads: begin, end
  int64_t oh, ow;
};

// Y = conv(X, W) + B (B may be null). The batch is split over the pool's threads, each running
// oneDNN on one thread. False (nothing written) when oneDNN is not built in, has no direct
// kernel for the shape, or GRAPHTRAIN_CONV_ALGORITHM=im2col.
bool dnnl_conv_forward(ThreadPool& pool, const ConvShape& s, const float* x, const float* w,
                       const float* b, float* y);

// The gradients of X and W for gradient dY (dx or dw null: not wanted). dW is summed over the
// threads' parts of the batch in thread order. False as for the forward.
bool dnnl_conv_backward(ThreadPool& pool, const ConvShape& s, const float* dy, const float* x,
                        const float* w, float* dx, float* dw);

}  // namespace graphtrain::cpu
