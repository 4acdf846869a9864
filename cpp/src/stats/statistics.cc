#include "graphtrain/statistics.h"

#include <cmath>
#include <cstdio>
#include <limits>

#include "graphtrain/error.h"
#include "graphtrain/strings.h"
#include "graphtrain/thread_pool.h"

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

template <typename T>
void scan(const T* p, int64_t lo, int64_t hi, Moments& m) {
  for (int64_t i = lo; i < hi; ++i) m.add(static_cast<double>(p[i]));
}

void scan_bucket(const Tensor& t, int64_t lo, int64_t hi, Moments& m) {
  switch (t.dtype()) {
    case DType::kFloat32:
      return scan(t.data<float>(), lo, hi, m);
    case DType::kFloat64:
      return scan(t.data<double>(), lo, hi, m);
    case DType::kInt64:
      return scan(t.data<int64_t>(), lo, hi, m);
    case DType::kInt32:
      return scan(t.data<int32_t>(), lo, hi, m);
    default:
      for (int64_t i = lo; i < hi; ++i) m.add(t.as_double(i));  // 16-bit floats widen to double
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
                          ThreadPool* pool) {
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

}  // namespace graphtrain
