// graphtrain._C.tensor_stats: the C++ statistics for Python (StatisticsSubscriber, tests).
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "bindings/bindings.h"
#include "graphtrain/error.h"
#include "graphtrain/statistics.h"
#include "graphtrain/strings.h"

namespace nb = nanobind;

namespace graphtrain::bindings {

void bind_stats(nb::module_& m) {
  m.def(
      "tensor_stats",
      [](nb::handle array, int64_t bucket_size, size_t first_values, const std::string& name,
         size_t sample_values) {
        Tensor t = array_to_tensor(array, "tensor_stats");
        TensorStats s;
        {
          nb::gil_scoped_release release;
          s = compute_stats(t, bucket_size, first_values, sample_values);
        }
        nb::dict d;
        d["dtype"] = to_string(s.dtype);
        d["shape"] = std::vector<int64_t>(s.shape.begin(), s.shape.end());
        d["count"] = s.count;
        d["finite"] = s.finite;
        d["min"] = s.min;
        d["max"] = s.max;
        d["mean"] = s.mean;
        d["std"] = s.std;
        d["nan"] = s.nan_count;
        d["inf"] = s.inf_count;
        d["negative"] = s.negative;
        d["positive"] = s.positive;
        d["zero"] = s.zero;
        d["first"] = s.first;
        d["sample"] = s.sample;
        if (!name.empty()) d["text"] = format_stats(s, name);
        return d;
      },
      nb::arg("tensor"), nb::arg("bucket_size") = int64_t{1} << 29, nb::arg("first_values") = 128,
      nb::arg("name") = "", nb::arg("sample_values") = 0,
      "Statistics of a numpy array or torch tensor in one pass (see graphtrain/statistics.h); with "
      "a name, also their text as written to a dump file (key 'text').");
  m.def(
      "stats_record",
      [](nb::handle array, const std::string& name, const std::string& module_path,
         int64_t bucket_size, size_t first_values, size_t sample_values, bool text) {
        Tensor t = array_to_tensor(array, "stats_record");
        std::string record, formatted;
        {
          nb::gil_scoped_release release;
          TensorStats s = compute_stats(t, bucket_size, first_values, sample_values);
          record = stats_record(s, name, module_path);
          if (text) formatted = format_stats(s, name);
        }
        nb::object shown =
            text ? nb::object(nb::str(formatted.data(), formatted.size())) : nb::object(nb::none());
        return nb::make_tuple(nb::bytes(record.data(), record.size()), shown);
      },
      nb::arg("tensor"), nb::arg("name"), nb::arg("module_path"),
      nb::arg("bucket_size") = int64_t{1} << 29, nb::arg("first_values") = 128,
      nb::arg("sample_values") = 256, nb::arg("text") = false,
      "The statistics of a tensor as one statistics.bin record (bytes), and with text=True also "
      "their dump file text (else None): what StatisticsSubscriber writes, in one call.");
  m.def(
      "format_stats",
      [](const std::string& name, const std::string& dtype, const std::vector<int64_t>& shape,
         const std::vector<double>& fields, const std::vector<double>& first) {
        // fields: count, min, max, mean, std, nan, inf, negative, positive, zero
        if (fields.size() != 10)
          throw Error(str_cat("format_stats: 10 fields expected, got ", fields.size()));
        TensorStats s;
        for (int code = 0; code <= static_cast<int>(DType::kBool); ++code)
          if (dtype == to_string(static_cast<DType>(code))) s.dtype = static_cast<DType>(code);
        s.shape = Shape(shape.begin(), shape.end());
        s.count = static_cast<int64_t>(fields[0]);
        s.min = fields[1], s.max = fields[2], s.mean = fields[3], s.std = fields[4];
        s.nan_count = static_cast<int64_t>(fields[5]);
        s.inf_count = static_cast<int64_t>(fields[6]);
        s.negative = static_cast<int64_t>(fields[7]);
        s.positive = static_cast<int64_t>(fields[8]);
        s.zero = static_cast<int64_t>(fields[9]);
        s.first = first;
        return format_stats(s, name);
      },
      nb::arg("name"), nb::arg("dtype"), nb::arg("shape"), nb::arg("fields"), nb::arg("first"),
      "The text of a dump file from statistics read back from a statistics.bin record.");
}

}  // namespace graphtrain::bindings
