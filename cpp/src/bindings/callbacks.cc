// graphtrain._C callbacks: the host side of callback nodes (graphtrain/callback.h). One Python
// function receives every Hook / HookGrad / PythonOp / PythonOpGrad call; PythonOp shape inferers
// registered from Python are called with symbolic dims as ints and names.
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <stdexcept>

#include "bindings/bindings.h"
#include "graphtrain/callback.h"
#include "graphtrain/dtype.h"
#include "graphtrain/error.h"
#include "graphtrain/strings.h"

namespace nb = nanobind;

namespace graphtrain::bindings {

nb::dict attributes_of(const Node& node) {
  nb::dict d;
  for (const auto& [name, a] : node.attributes) {
    switch (a.kind) {
      case Attribute::Kind::kInt:
        d[name.c_str()] = a.i;
        break;
      case Attribute::Kind::kFloat:
        d[name.c_str()] = a.f;
        break;
      case Attribute::Kind::kString:
        d[name.c_str()] = a.s;
        break;
      case Attribute::Kind::kInts:
        d[name.c_str()] = a.ints;
        break;
      case Attribute::Kind::kFloats:
        d[name.c_str()] = a.floats;
        break;
      case Attribute::Kind::kStrings:
        d[name.c_str()] = a.strings;
        break;
      case Attribute::Kind::kTensor:
        break;
    }
  }
  return d;
}

namespace {

nb::list shape_to_python(const SymShape& shape) {
  nb::list out;
  for (const SymDim& d : shape) {
    if (auto c = d.constant())
      out.append(*c);
    else
      out.append(d.to_string());
  }
  return out;
}

SymShape shape_from_python(nb::handle shape, const std::string& what) {
  SymShape out;
  for (nb::handle d : shape) {
    if (nb::isinstance<nb::int_>(d))
      out.push_back(SymDim(nb::cast<int64_t>(d)));
    else if (nb::isinstance<nb::str>(d))
      out.push_back(SymDim::parse(nb::cast<std::string>(d)));
    else
      throw InputError(what + ": a dim must be an int or a symbolic dim name, got " +
                       nb::cast<std::string>(nb::repr(d)));
  }
  return out;
}

// The Python callable stays referenced for the process's lifetime (it is replaced, never freed at
// interpreter shutdown, when the GIL may be gone).
PyObject* g_callback = nullptr;

std::vector<Tensor> call_host(const Node& node, const std::vector<Tensor>& inputs) {
  nb::gil_scoped_acquire gil;
  nb::list ins;
  for (const Tensor& t : inputs) ins.append(t.defined() ? tensor_to_torch(t) : nb::none());
  nb::object result = nb::borrow(g_callback)(node.op_type, attributes_of(node), ins);
  std::vector<Tensor> out;
  size_t k = 0;
  for (nb::handle item : result) {
    if (item.is_none()) {
      out.emplace_back();
    } else {
      // A tensor handed back unchanged keeps the engine's own tensor (no round trip).
      bool same = false;
      for (size_t i = 0; i < inputs.size() && !same; ++i)
        if (item.is(ins[i])) {
          out.push_back(inputs[i]);
          same = true;
        }
      if (!same) out.push_back(array_to_tensor(item, str_cat(node.describe(), " output ", k)));
    }
    ++k;
  }
  return out;
}

}  // namespace

void bind_callbacks(nb::module_& m) {
  m.def(
      "set_callback",
      [](nb::object fn) {
        if (!fn.is_none() && !PyCallable_Check(fn.ptr()))
          throw InputError("set_callback needs a callable or None");
        PyObject* old = g_callback;
        g_callback = fn.is_none() ? nullptr : fn.inc_ref().ptr();
        Py_XDECREF(old);
        set_host_callback(g_callback ? HostCallback(call_host) : HostCallback());
      },
      nb::arg("fn").none(),
      "Installs fn(op_type, attributes, inputs) -> outputs, called for every callback node.");

  m.def(
      "register_python_op_inferer",
      [](const std::string& func_name, nb::object fn) {
        if (fn.is_none()) {
          register_python_op_inferer(func_name, {});
          return;
        }
        // Kept for the process's lifetime, like the callback.
        PyObject* held = fn.inc_ref().ptr();
        register_python_op_inferer(func_name, [held](const Node& node, const PythonOpShapes& in) {
          nb::gil_scoped_acquire gil;
          nb::list shapes, dtypes;
          for (const SymShape& s : in.shapes) shapes.append(shape_to_python(s));
          for (DType d : in.dtypes) dtypes.append(to_onnx(d));
          nb::object result;
          try {
            result = nb::borrow(held)(attributes_of(node), shapes, dtypes);
          } catch (nb::python_error& e) {
            // The message, not the interpreter's whole traceback: the caller names the function.
            throw std::runtime_error(nb::cast<std::string>(nb::str(e.type().attr("__name__"))) +
                                     ": " + nb::cast<std::string>(nb::str(e.value())));
          }
          std::string fn_name = node.attr_string("func_name", "");
          PythonOpShapes out;
          nb::handle out_shapes = result[0], out_dtypes = result[1];
          size_t i = 0;
          for (nb::handle s : out_shapes)
            out.shapes.push_back(shape_from_python(
                s, str_cat("shape inferer of PythonOp '", fn_name, "', output ", i++)));
          for (nb::handle d : out_dtypes) out.dtypes.push_back(from_onnx(nb::cast<int>(d)));
          return out;
        });
      },
      nb::arg("func_name"), nb::arg("fn").none(),
      "Registers fn(attributes, input_shapes, input_onnx_dtypes) -> (output_shapes, "
      "output_onnx_dtypes) as the shape inferer of the PythonOps of func_name (None removes it).");
}

}  // namespace graphtrain::bindings
