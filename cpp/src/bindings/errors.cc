#include <cstring>
#include <exception>

#include "bindings/bindings.h"
#include "graphtrain/error.h"

namespace nb = nanobind;

namespace graphtrain::bindings {
namespace {

// The exception classes live in Python (graphtrain.errors) so they can derive from both
// GraphtrainError and the matching built-in (ValueError for OptionError).
void raise_python(const char* class_name, const char* message) {
  nb::object cls = nb::module_::import_("graphtrain.errors").attr(class_name);
  // Names from a corrupted file may not be valid UTF-8: replace, never fail to raise.
  PyObject* text =
      PyUnicode_DecodeUTF8(message, static_cast<Py_ssize_t>(std::strlen(message)), "replace");
  PyErr_SetObject(cls.ptr(), text);
  Py_XDECREF(text);
}

}  // namespace

void bind_errors(nb::module_&) {
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const OptionError& e) {
      raise_python("OptionError", e.what());
    } catch (const InputError& e) {
      raise_python("InputError", e.what());
    } catch (const ModelFileError& e) {
      raise_python("ModelFileError", e.what());
    } catch (const GraphError& e) {
      raise_python("GraphError", e.what());
    } catch (const Error& e) {
      raise_python("GraphtrainError", e.what());
    }
  });
}

}  // namespace graphtrain::bindings
