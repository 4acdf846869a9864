#include "graphtrain/statistics.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>

#include "graphtrain/error.h"
#include "graphtrain/strings.h"
#include "graphtrain/thread_pool.h"
#include "kernels/cpu/vec_math.h"

namespace graphtrain {
namespace {

// Running moments of the finite values of one bucket.
struct Moments {
  int64_t n = 0;
  double mean = 0, m2 = 0;
  double min = std::numeric_limits<double>::infinity();
  double max = -std::numeric_limits<double>::infinity();
  int64_t nan = 0, inf = 0, neg = 0, pos = 0, zero = 0;

  void add(double x) {
    if (std::isnan(x)) {
      ++nan;
      return;
    }
    if (x < 0)
      ++neg;
    else if (x > 0)
      ++pos;
    else
      ++zero;
    if (std::isinf(x)) {
      ++inf;
      return;
    }
    ++n;
    double d = x - mean;
    mean += d / static_cast<double>(n);
    m2 += d * (x - mean);
    if (x < min) min = x;
    if (x > max) max = x;
  }

  // Chan et al.'s pooled combination: exact for the variance of the union.
  void merge(const Moments& o) {
    nan += o.nan;
    inf += o.inf;
    neg += o.neg;
    pos += o.pos;
    zero += o.zero;
    if (o.n == 0) return;
    if (n == 0) {
      n = o.n, mean = o.mean, m2 = o.m2, min = o.min, max = o.max;
      return;
    }
    int64_t total = n + o.n;
    double delta = o.mean - mean;
    mean += delta * static_cast<double>(o.n) / static_cast<double>(total);
    m2 += o.m2 + delta * delta * static_cast<double>(n) * static_cast<double>(o.n) /
                     static_cast<double>(total);
    n = total;
    if (o.min < min) min = o.min;
    if (o.max > max) max = o.max;
  }
};

// The moments of a block of finite values in two passes over data still in cache: sum, min, max
// and signs, then the squared deviations from the block's mean (independent accumulators, so the
// loops pipeline and vectorize). False when the block holds a NaN or an infinity (or its sum
// overflows): the caller then takes it value by value.
constexpr int64_t kBlock = 2048;

bool finite_block(const double* x, int64_t n, Moments& out) {
  double sum[4] = {0, 0, 0, 0};
  double lo[4], hi[4];
  int64_t neg[4] = {0, 0, 0, 0}, pos[4] = {0, 0, 0, 0};
  for (int j = 0; j < 4; ++j) {
    lo[j] = std::numeric_limits<double>::infinity();
    hi[j] = -lo[j];
  }
  int64_t i = 0;
  for (; i + 4 <= n; i += 4)
    for (int j = 0; j < 4; ++j) {
      double v = x[i + j];
      sum[j] += v;
      lo[j] = v < lo[j] ? v : lo[j];
      hi[j] = v > hi[j] ? v : hi[j];
      neg[j] += v < 0;
      pos[j] += v > 0;
    }
  for (; i < n; ++i) {
    double v = x[i];
    sum[0] += v;
    lo[0] = v < lo[0] ? v : lo[0];
    hi[0] = v > hi[0] ? v : hi[0];
    neg[0] += v < 0;
    pos[0] += v > 0;
  }
  double total = (sum[0] + sum[1]) + (sum[2] + sum[3]);
  if (!std::isfinite(total)) return false;  // NaN, infinity, or overflow
  double mean = total / static_cast<double>(n);
  double m2[4] = {0, 0, 0, 0};
  for (i = 0; i + 4 <= n; i += 4)
    for (int j = 0; j < 4; ++j) {
      double d = x[i + j] - mean;
      m2[j] += d * d;
    }
  for (; i < n; ++i) m2[0] += (x[i] - mean) * (x[i] - mean);
  out = Moments();
  out.n = n;
  out.mean = mean;
  out.m2 = (m2[0] + m2[1]) + (m2[2] + m2[3]);
  out.min = std::min(std::min(lo[0], lo[1]), std::min(lo[2], lo[3]));
  out.max = std::max(std::max(hi[0], hi[1]), std::max(hi[2], hi[3]));
  out.neg = (neg[0] + neg[1]) + (neg[2] + neg[3]);
  out.pos = (pos[0] + pos[1]) + (pos[2] + pos[3]);
  out.zero = n - out.neg - out.pos;
  return true;
}

// finite_block for float32 data read in place, in the kernels' 8-lane vectors (AVX2 on x86-64-v3):
// min, max and signs in float (exact), sums in double. Most dumps are float32.
using cpu::vec::f8;
using cpu::vec::i8;
using d4 = double __attribute__((vector_size(32)));
inline d4 low4(f8 v) {
  return __builtin_convertvector(__builtin_shufflevector(v, v, 0, 1, 2, 3), d4);
}
inline d4 high4(f8 v) {
  return __builtin_convertvector(__builtin_shufflevector(v, v, 4, 5, 6, 7), d4);
}

// One pass: sums of d = x - x[0] and of d * d in double (shifted by the block's first value, so
// the variance sum(d^2) - sum(d)^2 / n loses only ((x[0] - mean) / std)^2 of double's precision).
bool finite_block_f32(const float* x, int64_t n, Moments& out) {
  const float inf = std::numeric_limits<float>::infinity();
  const double shift = x[0];
  d4 s0 = {}, s1 = {}, q0 = {}, q1 = {};
  f8 lo = f8{} + inf, hi = f8{} - inf, zero = {};
  i8 neg = {}, pos = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    f8 v = cpu::vec::load(x + i);
    d4 a = low4(v) - shift, b = high4(v) - shift;
    s0 += a;
    s1 += b;
    q0 += a * a;
    q1 += b * b;
    lo = v < lo ? v : lo;
    hi = v > hi ? v : hi;
    neg -= v < zero;  // a true comparison is -1 in every lane it holds
    pos -= v > zero;
  }
  d4 s = s0 + s1, q = q0 + q1;
  double sum = (s[0] + s[1]) + (s[2] + s[3]), squares = (q[0] + q[1]) + (q[2] + q[3]);
  double mn = inf, mx = -inf;
  int64_t negatives = 0, positives = 0;
  for (int j = 0; j < 8; ++j) {
    mn = std::min(mn, static_cast<double>(lo[j]));
    mx = std::max(mx, static_cast<double>(hi[j]));
    negatives += neg[j];
    positives += pos[j];
  }
  for (; i < n; ++i) {
    double v = x[i];
    sum += v - shift;
    squares += (v - shift) * (v - shift);
    mn = std::min(mn, v);
    mx = std::max(mx, v);
    negatives += v < 0;
    positives += v > 0;
  }
  if (!std::isfinite(sum) || !std::isfinite(squares)) return false;  // NaN, inf, overflow
  double count = static_cast<double>(n);
  out = Moments();
  out.n = n;
  out.mean = shift + sum / count;
  out.m2 = std::max(0.0, squares - sum * sum / count);
  out.min = mn;
  out.max = mx;
  out.neg = negatives;
  out.pos = positives;
  out.zero = n - negatives - positives;
  return true;
}

template <typename Load>
void scan(int64_t lo, int64_t hi, Moments& m, Load load) {
  double buf[kBlock];
  for (int64_t b = lo; b < hi; b += kBlock) {
    int64_t n = std::min(kBlock, hi - b);
    for (int64_t i = 0; i < n; ++i) buf[i] = load(b + i);
    Moments block;
    if (!finite_block(buf, n, block)) {
      block = Moments();
      for (int64_t i = 0; i < n; ++i) block.add(buf[i]);
    }
    m.merge(block);
  }
}

void scan_bucket(const Tensor& t, int64_t lo, int64_t hi, Moments& m) {
  auto typed = [&](auto* p) {
    scan(lo, hi, m, [p](int64_t i) { return static_cast<double>(p[i]); });
  };
  switch (t.dtype()) {
    case DType::kFloat32: {
      const float* p = t.data<float>();
      for (int64_t b = lo; b < hi; b += kBlock) {
        int64_t n = std::min(kBlock, hi - b);
        Moments block;
        if (!finite_block_f32(p + b, n, block)) {
          block = Moments();
          for (int64_t i = 0; i < n; ++i) block.add(static_cast<double>(p[b + i]));
        }
        m.merge(block);
      }
      return;
    }
    case DType::kFloat64:
      return typed(t.data<double>());
    case DType::kInt64:
      return typed(t.data<int64_t>());
    case DType::kInt32:
      return typed(t.data<int32_t>());
    default:  // 16-bit floats widen to double, like every other type
      return scan(lo, hi, m, [&t](int64_t i) { return t.as_double(i); });
  }
}

std::string number(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.9g", v);
  return buf;
}

}  // namespace

TensorStats compute_stats(const Tensor& t, int64_t bucket_size, size_t first_values,
                          size_t sample_values, ThreadPool* pool) {
  if (bucket_size < 1)
    throw Error(str_cat("statistics: bucket size must be positive, got ", bucket_size));
  TensorStats s;
  s.dtype = t.dtype();
  s.shape = t.shape();
  s.count = t.numel();
  int64_t buckets = (s.count + bucket_size - 1) / bucket_size;
  // Each bucket is split among the threads; the parts and then the buckets are pooled in order,
  // so the result does not depend on the thread count beyond float rounding of the pooling.
  Moments total;
  ThreadPool& p = pool ? *pool : ThreadPool::global();
  for (int64_t b = 0; b < buckets; ++b) {
    int64_t lo = b * bucket_size, hi = std::min(s.count, lo + bucket_size);
    int64_t parts = std::max<int64_t>(1, std::min<int64_t>(p.num_threads(), (hi - lo) / (1 << 16)));
    std::vector<Moments> part(static_cast<size_t>(parts));
    int64_t step = (hi - lo + parts - 1) / parts;
    p.parallel_for(parts, 1, [&](int64_t k0, int64_t k1) {
      for (int64_t k = k0; k < k1; ++k)
        scan_bucket(t, lo + k * step, std::min(hi, lo + (k + 1) * step),
                    part[static_cast<size_t>(k)]);
    });
    for (const Moments& m : part) total.merge(m);
  }
  const double nan = std::numeric_limits<double>::quiet_NaN();
  s.finite = total.n;
  s.nan_count = total.nan;
  s.inf_count = total.inf;
  s.negative = total.neg;
  s.positive = total.pos;
  s.zero = total.zero;
  s.min = total.n ? total.min : nan;
  s.max = total.n ? total.max : nan;
  s.mean = total.n ? total.mean : nan;
  s.std = total.n > 1 ? std::sqrt(total.m2 / static_cast<double>(total.n - 1)) : nan;
  int64_t k = std::min<int64_t>(s.count, static_cast<int64_t>(first_values));
  for (int64_t i = 0; i < k; ++i) s.first.push_back(t.as_double(i));
  k = std::min<int64_t>(s.count, static_cast<int64_t>(sample_values));
  for (int64_t i = 0; i < k; ++i) s.sample.push_back(t.as_double(i * s.count / k));
  return s;
}

std::string format_stats(const TensorStats& s, const std::string& name) {
  std::string out =
      str_cat("name: ", name, "\nshape: ", s.shape, "\ndtype: ", to_string(s.dtype),
              "\nelements: ", s.count, "\nmin: ", number(s.min), "\nmax: ", number(s.max),
              "\nmean: ", number(s.mean), "\nstd: ", number(s.std), "\nnan: ", s.nan_count,
              "\ninf: ", s.inf_count, "\nnegative: ", s.negative, "\npositive: ", s.positive,
              "\nzero: ", s.zero, "\nfirst ", s.first.size(), " values:");
  for (size_t i = 0; i < s.first.size(); ++i) {
    out.push_back(i % 8 ? ' ' : '\n');
    out += number(s.first[i]);
  }
  out += "\n";
  return out;
}

namespace {

template <typename T>
void put(std::string& out, T v) {
  static_assert(std::endian::native == std::endian::little, "statistics.bin is little-endian");
  char bytes[sizeof(T)];
  std::memcpy(bytes, &v, sizeof(T));
  out.append(bytes, sizeof(T));
}

void put_text(std::string& out, const std::string& text) {
  put(out, static_cast<uint32_t>(text.size()));
  out += text;
}

void put_values(std::string& out, const std::vector<double>& values) {
  put(out, static_cast<uint32_t>(values.size()));
  out.append(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(double));
}

}  // namespace

std::string stats_record(const TensorStats& s, const std::string& name,
                         const std::string& module_path) {
  std::string out;
  out.reserve(name.size() + module_path.size() + 160 +
              8 * (s.shape.size() + s.first.size() + s.sample.size()));
  put_text(out, name);
  put_text(out, module_path);
  put_text(out, to_string(s.dtype));
  put(out, static_cast<uint32_t>(s.shape.size()));
  for (int64_t d : s.shape) put(out, d);
  for (double v : {static_cast<double>(s.count), static_cast<double>(s.finite), s.min, s.max,
                   s.mean, s.std, static_cast<double>(s.nan_count),
                   static_cast<double>(s.inf_count), static_cast<double>(s.negative),
                   static_cast<double>(s.positive), static_cast<double>(s.zero)})
    put(out, v);
  put_values(out, s.first);
  put_values(out, s.sample);
  return out;
}

}  // namespace graphtrain
