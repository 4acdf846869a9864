#include <nanobind/stl/string.h>

#include <memory>

#include "bindings/bindings.h"
#include "graphtrain/log.h"
#include "graphtrain/output_capture.h"

namespace nb = nanobind;

namespace graphtrain::bindings {
namespace {

// Holds the Python callable of the log sink. The last reference may be dropped on a C++ thread that
// does not hold the GIL, so the destructor takes it (or leaks the object once Python has gone).
struct PythonSink {
  nb::object fn;
  explicit PythonSink(nb::object f) : fn(std::move(f)) {}
  ~PythonSink() {
    if (Py_IsInitialized()) {
      nb::gil_scoped_acquire gil;
      fn.reset();
    } else {
      fn.release();
    }
  }
  void operator()(const LogRecord& r) const {
    if (!Py_IsInitialized()) return;
    nb::gil_scoped_acquire gil;
    try {
      fn(static_cast<int>(r.level), r.rank, r.show_rank,
         nb::str(r.message.data(), r.message.size()), r.file ? r.file : "", r.line);
    } catch (nb::python_error& e) {
      e.discard_as_unraisable("graphtrain log sink");
    }
  }
};

LogLevel to_level(int level) {
  if (level < 0 || level > 5) throw nb::value_error("log level must be 0 (VERBOSE) to 5 (FATAL)");
  return static_cast<LogLevel>(level);
}

}  // namespace

void bind_log(nb::module_& m) {
  m.def("log_enabled", [](int level) { return Logger::global().enabled(to_level(level)); });
  m.def(
      "log",
      [](int level, const std::string& message, const std::string& file, int line) {
        Logger& logger = Logger::global();
        if (logger.enabled(to_level(level)))
          logger.emit(to_level(level), message, file.c_str(), line);
      },
      nb::arg("level"), nb::arg("message"), nb::arg("file") = "", nb::arg("line") = 0);
  m.def("log_level", [] { return static_cast<int>(Logger::global().level()); });
  m.def("log_rank", [] { return Logger::global().rank(); });
  m.def("set_log_rank", [](int rank) { Logger::global().set_rank(rank); });
  m.def(
      "set_log_sink",
      [](nb::object fn) {
        if (fn.is_none()) {
          Logger::global().set_sink(nullptr);
          return;
        }
        auto sink = std::make_shared<PythonSink>(std::move(fn));
        Logger::global().set_sink([sink](const LogRecord& r) { (*sink)(r); });
      },
      nb::arg("sink").none());
  m.def("is_known_noise", [](const std::string& line) { return is_known_noise(line); });

  nb::class_<OutputCapture>(m, "OutputCapture")
      .def(nb::init<std::string>(), nb::arg("phase"))
      .def_prop_ro("redirecting", &OutputCapture::redirecting)
      .def("finish_and_emit", &OutputCapture::finish_and_emit)
      .def("finish", [](OutputCapture& c) {
        CapturedOutput out = c.finish();
        nb::list kept;
        for (const auto& line : out.kept) kept.append(nb::str(line.data(), line.size()));
        return nb::make_tuple(kept, out.suppressed);
      });
}

}  // namespace graphtrain::bindings
