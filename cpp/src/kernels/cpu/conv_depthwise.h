// Depthwise convolution (group == C == M: one filter per channel; MobileNet's and ConvNeXt's
// spatial convolutions) by direct loops over NCHW planes. im2col + GEMM makes one tiny GEMM per
// channel of it (M 1, K kh * kw), and oneDNN 2.6 has JIT kernels for its forward only (its
// backward is a GEMM-based one as slow as im2col). torch's own depthwise backward is slower still:
// ConvNeXt's 7 x 7 layer [16, 32, 16, 16] takes 7.9 ms forward and backward in torch at one
// thread, 0.25 + 0.27 + 0.46 ms here (forward, dX, dW; im2col took ~7.7 ms for the backward).
#pragma once

#include "kernels/cpu/conv_dnnl.h"

namespace graphtrain {
class ThreadPool;
}

namespace graphtrain::cpu {

// Whether the convolution runs here: depthwise with one filter per channel, and
// GRAPHTRAIN_CONV_ALGORITHM AUTO (ONEDNN and IM2COL keep their meaning for every convolution).
bool runs_depthwise(const ConvShape& s);

// Y = depthwise_conv(X, W) + B (B may be null), W [C, 1, kh, kw].
void depthwise_conv_forward(ThreadPool& pool, const ConvShape& s, const float* x, const float* w,
                            const float* b, float* y);

// dX and dW (either may be null: not wanted) for gradient dY.
void depthwise_conv_backward(ThreadPool& pool, const ConvShape& s, const float* dy, const float* x,
                             const float* w, float* dx, float* dw);

}  // namespace graphtrain::cpu
