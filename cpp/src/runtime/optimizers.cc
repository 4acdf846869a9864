#include "graphtrain/optimizers.h"

#include <cmath>
#include <type_traits>

#include "core/denormals.h"
#include "graphtrain/thread_pool.h"

namespace graphtrain {
namespace {

constexpr int64_t kChunk = 1 << 14;  // elements per task

struct Chunk {
  size_t tensor;
  int64_t begin, end;
};

// All tensors' elements as chunks, so one parallel loop covers many small tensors.
template <typename T>
std::vector<Chunk> chunks_of(const std::vector<T>& tensors) {
  std::vector<Chunk> out;
  for (size_t t = 0; t < tensors.size(); ++t)
    for (int64_t b = 0; b < tensors[t].numel; b += kChunk)
      out.push_back({t, b, std::min(tensors[t].numel, b + kChunk)});
  return out;
}

struct AdamWConstants {
  float decay, w1, b2, w2, eps, neg_step, bc2_sqrt;
};

// The per-element AdamW update over n elements, options fixed at compile time: a plain loop over
// restrict pointers, which the compiler vectorizes.
template <bool kDecay, bool kAmsgrad, bool kMaximize>
void adamw_range(float* __restrict p, const float* __restrict grad, float* __restrict m,
                 float* __restrict v, float* __restrict vmax, int64_t n, AdamWConstants k) {
  for (int64_t i = 0; i < n; ++i) {
    float g = kMaximize ? -grad[i] : grad[i];
    float pi = kDecay ? p[i] * k.decay : p[i];
    float mi = std::fma(k.w1, g - m[i], m[i]);  // lerp with a small weight, as torch's
    float vi = v[i] * k.b2 + k.w2 * g * g;
    m[i] = mi;
    v[i] = vi;
    if constexpr (kAmsgrad) {
      float x = vmax[i];
      vi = (x != x || x > vi) ? x : vi;  // torch.maximum: NaN wins
      vmax[i] = vi;
    }
    float denom = std::sqrt(vi) / k.bc2_sqrt + k.eps;
    p[i] = pi + k.neg_step * mi / denom;
  }
}

struct SGDConstants {
  float wd, momentum, keep, neg_lr;
};

template <bool kMomentum, bool kFirst, bool kNesterov>
void sgd_range(float* __restrict p, const float* __restrict grad, float* __restrict buf, int64_t n,
               SGDConstants k, bool maximize) {
  const float sign = maximize ? -1.0f : 1.0f;  // exact: a sign flip
  for (int64_t i = 0; i < n; ++i) {
    float d = sign * grad[i];
    d = k.wd != 0 ? d + k.wd * p[i] : d;
    if constexpr (kMomentum) {
      float b = kFirst ? d : buf[i] * k.momentum + k.keep * d;
      buf[i] = b;
      d = kNesterov ? d + k.momentum * b : b;
    }
    p[i] = p[i] + k.neg_lr * d;
  }
}

}  // namespace

void adamw_step(ThreadPool& pool, const std::vector<AdamWTensor>& tensors, const AdamWOptions& o) {
  FlushDenormals flush;  // as graph runs
  // The scalars as torch computes them: in double, then used at float precision.
  struct Scalars {
    float step_size, bc2_sqrt;
  };
  std::vector<Scalars> scalars;
  for (const AdamWTensor& t : tensors) {
    double bc1 = 1.0 - std::pow(o.beta1, t.step);
    double bc2 = 1.0 - std::pow(o.beta2, t.step);
    scalars.push_back({static_cast<float>(o.lr / bc1), static_cast<float>(std::sqrt(bc2))});
  }
  const float decay = static_cast<float>(1.0 - o.lr * o.weight_decay);
  const float w1 = static_cast<float>(1.0 - o.beta1), b2 = static_cast<float>(o.beta2),
              w2 = static_cast<float>(1.0 - o.beta2), eps = static_cast<float>(o.eps);
  std::vector<Chunk> chunks = chunks_of(tensors);
  auto loop = [&](auto decays, auto amsgrad, auto maximize) {
    pool.parallel_for(static_cast<int64_t>(chunks.size()), 1, [&](int64_t lo, int64_t hi) {
      for (int64_t c = lo; c < hi; ++c) {
        const Chunk& ch = chunks[static_cast<size_t>(c)];
        const AdamWTensor& t = tensors[ch.tensor];
        const Scalars& sc = scalars[ch.tensor];
        int64_t b = ch.begin, n = ch.end - ch.begin;
        adamw_range<decltype(decays)::value, decltype(amsgrad)::value, decltype(maximize)::value>(
            t.param + b, t.grad + b, t.exp_avg + b, t.exp_avg_sq + b,
            t.max_exp_avg_sq ? t.max_exp_avg_sq + b : nullptr, n,
            {decay, w1, b2, w2, eps, -sc.step_size, sc.bc2_sqrt});
      }
    });
  };
  auto with_maximize = [&](auto decays, auto amsgrad) {
    if (o.maximize)
      loop(decays, amsgrad, std::true_type{});
    else
      loop(decays, amsgrad, std::false_type{});
  };
  auto with_amsgrad = [&](auto decays) {
    if (o.amsgrad)
      with_maximize(decays, std::true_type{});
    else
      with_maximize(decays, std::false_type{});
  };
  if (o.weight_decay != 0)
    with_amsgrad(std::true_type{});
  else
    with_amsgrad(std::false_type{});
}

void sgd_step(ThreadPool& pool, const std::vector<SGDTensor>& tensors, const SGDOptions& o) {
  FlushDenormals flush;  // as graph runs
  const SGDConstants k{static_cast<float>(o.weight_decay), static_cast<float>(o.momentum),
                       static_cast<float>(1.0 - o.dampening), -static_cast<float>(o.lr)};
  std::vector<Chunk> chunks = chunks_of(tensors);
  pool.parallel_for(static_cast<int64_t>(chunks.size()), 1, [&](int64_t lo, int64_t hi) {
    for (int64_t c = lo; c < hi; ++c) {
      const Chunk& ch = chunks[static_cast<size_t>(c)];
      const SGDTensor& t = tensors[ch.tensor];
      int64_t b = ch.begin, n = ch.end - ch.begin;
      float* p = t.param + b;
      const float* g = t.grad + b;
      float* buf = o.momentum != 0 ? t.momentum_buffer + b : nullptr;
      if (!buf)
        sgd_range<false, false, false>(p, g, nullptr, n, k, o.maximize);
      else if (t.first)
        (o.nesterov ? sgd_range<true, true, true> : sgd_range<true, true, false>)(p, g, buf, n, k,
                                                                                  o.maximize);
      else
        (o.nesterov ? sgd_range<true, false, true> : sgd_range<true, false, false>)(p, g, buf, n, k,
                                                                                    o.maximize);
    }
  });
}

}  // namespace graphtrain
