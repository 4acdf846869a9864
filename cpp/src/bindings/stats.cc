// graphtrain._C.tensor_stats: the C++ statistics for Python (StatisticsSubscriber, tests).
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "bindings/bindings.h"
#include "graphtrain/statistics.h"

namespace nb = nanobind;

namespace graphtrain::bindings {

void bind_stats(nb::module_& m) {
  m.def(
      "tensor_stats",
      [](nb::handle array, int64_t bucket_size, size_t first_values, const std::string& name) {
        Tensor t = array_to_tensor(array, "tensor_stats");
        TensorStats s;
        {
          nb::gil_scoped_release release;
          s = compute_stats(t, bucket_size, first_values);
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
        if (!name.empty()) d["text"] = format_stats(s, name);
        return d;
      },
      nb::arg("tensor"), nb::arg("bucket_size") = int64_t{1} << 29, nb::arg("first_values") = 128,
      nb::arg("name") = "",
      "Statistics of a numpy array or torch tensor in one pass (see graphtrain/statistics.h); with "
      "a name, also their text as written to a dump file (key 'text').");
}

}  // namespace graphtrain::bindings
