// Tensor statistics for convergence debugging, computed in one pass over the data.
//
// min, max, mean and std cover the finite elements (NaN and inf are counted apart, so one bad
// value does not hide the rest). std is the unbiased (n - 1) standard deviation, NaN below two
// finite elements. The pass runs bucket by bucket (Welford's update inside a bucket, buckets
// pooled with Chan's formula, which keeps the combined variance exact); float16 and bfloat16
// accumulate in double. Extra memory is a few numbers per bucket, whatever the tensor's size.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "graphtrain/tensor.h"

namespace graphtrain {

class ThreadPool;

struct TensorStats {
  DType dtype = DType::kUndefined;
  Shape shape;
  int64_t count = 0;   // all elements
  int64_t finite = 0;  // elements that are neither NaN nor inf
  double min = 0, max = 0, mean = 0, std = 0;
  int64_t nan_count = 0, inf_count = 0;
  int64_t negative = 0, positive = 0, zero = 0;
  std::vector<double> first;   // the first values, in order (up to `first_values`)
  std::vector<double> sample;  // up to `sample_values` values spread evenly over all elements
};

// `bucket_size` elements form one bucket (the unit of work of one thread). The sample takes the
// elements at i * count / k for i < k = min(count, sample_values): all of them in a small tensor.
TensorStats compute_stats(const Tensor& t, int64_t bucket_size = int64_t{1} << 29,
                          size_t first_values = 128, size_t sample_values = 0,
                          ThreadPool* pool = nullptr);

// The statistics as the text of a dump file: "name: value" lines.
std::string format_stats(const TensorStats& s, const std::string& name);

// One record of a statistics.bin file (format 2; little-endian): name, module path and dtype, each
// a uint32 length and UTF-8 bytes; the shape, a uint32 rank and int64 sizes; count, finite, min,
// max, mean, std, nan, inf, negative, positive, zero as float64; then `first` and `sample`, each a
// uint32 count and float64 values. The reader is python/graphtrain/hooks/_statistics.py.
std::string stats_record(const TensorStats& s, const std::string& name,
                         const std::string& module_path);

}  // namespace graphtrain
