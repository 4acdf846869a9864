// graphtrain.engine: Session and Model. Arrays cross by DLPack (numpy, torch, anything with
// __dlpack__ or the buffer protocol) with zero copy when they are contiguous.
#include <nanobind/ndarray.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cstring>
#include <type_traits>

#include "bindings/bindings.h"
#include "graphtrain/autodiff.h"
#include "graphtrain/callback.h"
#include "graphtrain/error.h"
#include "graphtrain/onnx_io.h"
#include "graphtrain/ops.h"
#include "graphtrain/passes.h"
#include "graphtrain/profiler.h"
#include "graphtrain/session.h"
#include "graphtrain/strings.h"
#include "graphtrain/thread_pool.h"
#include "graphtrain/verifier.h"

namespace nb = nanobind;

namespace graphtrain::bindings {
namespace {

using AnyArray = nb::ndarray<nb::ro, nb::device::cpu>;

DType from_dlpack(nb::dlpack::dtype t) {
  using C = nb::dlpack::dtype_code;
  auto code = static_cast<C>(t.code);
  if (t.lanes != 1) return DType::kUndefined;
  if (code == C::Float && t.bits == 32) return DType::kFloat32;
  if (code == C::Float && t.bits == 16) return DType::kFloat16;
  if (code == C::Float && t.bits == 64) return DType::kFloat64;
  if (code == C::Bfloat && t.bits == 16) return DType::kBFloat16;
  if (code == C::Int && t.bits == 64) return DType::kInt64;
  if (code == C::Int && t.bits == 32) return DType::kInt32;
  if (code == C::Int && t.bits == 8) return DType::kInt8;
  if (code == C::UInt && t.bits == 8) return DType::kUInt8;
  if (code == C::Bool && t.bits == 8) return DType::kBool;
  return DType::kUndefined;
}

nb::dlpack::dtype to_dlpack(DType d) {
  using C = nb::dlpack::dtype_code;
  auto make = [](C code, uint8_t bits) {
    nb::dlpack::dtype t;
    t.code = static_cast<uint8_t>(code);
    t.bits = bits;
    t.lanes = 1;
    return t;
  };
  switch (d) {
    case DType::kFloat32:
      return make(C::Float, 32);
    case DType::kFloat16:
      return make(C::Float, 16);
    case DType::kFloat64:
      return make(C::Float, 64);
    case DType::kBFloat16:
      return make(C::Bfloat, 16);
    case DType::kInt64:
      return make(C::Int, 64);
    case DType::kInt32:
      return make(C::Int, 32);
    case DType::kInt8:
      return make(C::Int, 8);
    case DType::kUInt8:
      return make(C::UInt, 8);
    case DType::kBool:
      return make(C::Bool, 8);
    case DType::kUndefined:
      break;
  }
  throw Error("tensor of undefined element type");
}

bool is_torch(nb::handle obj) {
  nb::handle mod = nb::getattr(obj.type(), "__module__", nb::none());
  return nb::isinstance<nb::str>(mod) && nb::cast<std::string>(mod).rfind("torch", 0) == 0;
}

// Wraps a Python array (or DLPack capsule) as a Tensor without copying when it is contiguous; its
// data stays alive as long as the tensor's storage does.
// `what` names the input in errors (a string, or a function making it: built only on an error).
template <typename What>
Tensor to_tensor(nb::handle obj, const What& what_of) {
  auto what = [&]() -> std::string {
    if constexpr (std::is_invocable_v<What>)
      return what_of();
    else
      return what_of;
  };
  AnyArray arr;
  try {
    arr = nb::cast<AnyArray>(obj);
  } catch (const std::exception&) {
    throw InputError(what() + ": expected a numpy array or a torch tensor on the CPU, got " +
                     nb::cast<std::string>(nb::str(obj.type())));
  }
  DType dtype = from_dlpack(arr.dtype());
  if (dtype == DType::kUndefined)
    throw InputError(what() + ": unsupported element type (code " +
                     std::to_string(arr.dtype().code) + ", " + std::to_string(arr.dtype().bits) +
                     " bits)");
  Shape shape;
  for (size_t i = 0; i < arr.ndim(); ++i) shape.push_back(static_cast<int64_t>(arr.shape(i)));
  bool contiguous = true;
  int64_t expect = 1;
  for (size_t i = arr.ndim(); i-- > 0;) {
    if (arr.shape(i) != 1 && arr.stride(i) != expect) contiguous = false;
    expect *= static_cast<int64_t>(arr.shape(i));
  }
  if (contiguous) {
    // The imported array holds the producer's data (through the DLPack tensor it took, or the
    // buffer): kept as long as the storage. Not `obj`: a DLPack capsule, once imported, no longer
    // owns the data.
    auto* keep = new AnyArray(arr);
    return Tensor::borrow(const_cast<void*>(arr.data()), dtype, shape, [keep] {
      nb::gil_scoped_acquire gil;
      delete keep;
    });
  }
  // A strided view: copy it densely.
  Tensor t = Tensor::empty(dtype, shape);
  size_t es = dtype_size(dtype);
  const char* src = static_cast<const char*>(arr.data());
  char* dst = static_cast<char*>(t.raw_data());
  int64_t n = t.numel();
  std::vector<int64_t> idx(arr.ndim(), 0);
  for (int64_t k = 0; k < n; ++k) {
    int64_t off = 0;
    for (size_t i = 0; i < arr.ndim(); ++i) off += idx[i] * arr.stride(i);
    std::memcpy(dst + k * static_cast<int64_t>(es), src + off * static_cast<int64_t>(es), es);
    for (size_t i = arr.ndim(); i-- > 0;) {
      if (++idx[i] < static_cast<int64_t>(arr.shape(i))) break;
      idx[i] = 0;
    }
  }
  return t;
}

// A DLPack capsule ("dltensor") viewing a tensor, C-contiguous, with no copy. The layout of
// DLManagedTensor (the DLPack tensor, manager_ctx, deleter) comes first; the consumer calls the
// deleter when it is done, or the capsule does if nothing consumed it.
struct ManagedTensor {
  nb::dlpack::dltensor dl;
  void* manager_ctx = nullptr;
  void (*deleter)(ManagedTensor*) = nullptr;
  Tensor tensor;  // ours from here on: what keeps the data alive
  std::vector<int64_t> shape, strides;
};

nb::object to_capsule(const Tensor& t) {
  auto* m = new ManagedTensor();
  m->tensor = t;
  m->shape.assign(t.shape().begin(), t.shape().end());
  m->strides.assign(m->shape.size(), 1);
  for (size_t i = m->shape.size(); i-- > 1;) m->strides[i - 1] = m->strides[i] * m->shape[i];
  m->dl.data = t.numel() ? t.raw_data() : nullptr;
  m->dl.device = {1, 0};  // kDLCPU
  m->dl.ndim = static_cast<int32_t>(m->shape.size());
  m->dl.dtype = to_dlpack(t.dtype());
  m->dl.shape = m->shape.data();
  m->dl.strides = m->strides.data();
  m->manager_ctx = m;
  m->deleter = [](ManagedTensor* p) { delete p; };
  PyObject* capsule = PyCapsule_New(m, "dltensor", [](PyObject* c) {
    if (!PyCapsule_IsValid(c, "dltensor")) return;  // consumed ("used_dltensor"): not ours
    auto* m = static_cast<ManagedTensor*>(PyCapsule_GetPointer(c, "dltensor"));
    m->deleter(m);
  });
  if (!capsule) {
    delete m;
    throw nb::python_error();
  }
  return nb::steal(capsule);
}

// How run hands its results to Python: numpy arrays, torch tensors (through nanobind's export:
// torch.utils.dlpack.from_dlpack of an object with __dlpack__), or bare DLPack capsules, which
// GraphModule turns into tensors itself (torch.utils.dlpack.from_dlpack of a capsule skips the
// protocol's Python layers: ~3 us less per tensor, ~0.5 ms per training step of the GPT bench).
enum class Results { kNumpy, kTorch, kCapsules };

nb::object to_python(const Tensor& t, Results kind) {
  if (kind == Results::kCapsules) return to_capsule(t);
  auto* keep = new Tensor(t);
  nb::capsule owner(keep, [](void* p) noexcept { delete static_cast<Tensor*>(p); });
  std::vector<size_t> shape(t.shape().begin(), t.shape().end());
  void* data = t.numel() ? t.raw_data() : nullptr;
  if (kind == Results::kTorch)
    return nb::cast(nb::ndarray<nb::pytorch>(data, shape.size(), shape.data(), owner, nullptr,
                                             to_dlpack(t.dtype())));
  return nb::cast(nb::ndarray<nb::numpy>(data, shape.size(), shape.data(), owner, nullptr,
                                         to_dlpack(t.dtype())));
}

// Engine tensors that stay in C++ between two runs: the values a training forward stashes for its
// backward. GraphModule passes them back as one object, so they never cross DLPack into torch
// tensors and back (two conversions of ~60 tensors a step on the GPT bench model).
struct Stash {
  std::vector<Tensor> tensors;  // empty once fed to a run, which takes them (a run keeps >= 1)
};

nb::list run_session(Session& s, nb::handle feeds, bool capsules = false, size_t keep = 0) {
  std::vector<Tensor> inputs;
  bool torch = false;
  auto kind = [&] {
    return capsules ? Results::kCapsules : torch ? Results::kTorch : Results::kNumpy;
  };
  auto wrap = [&](const std::vector<Tensor>& out) {
    if (keep > out.size())
      throw InputError(
          str_cat("asked to keep ", keep, " outputs in C++, the graph has ", out.size()));
    nb::list result;
    size_t n = out.size() - keep;
    for (size_t k = 0; k < n; ++k) result.append(to_python(out[k], kind()));
    if (keep) result.append(nb::cast(Stash{{out.begin() + static_cast<ptrdiff_t>(n), out.end()}}));
    return result;
  };
  if (nb::isinstance<nb::dict>(feeds)) {
    std::map<std::string, Tensor> by_name;
    for (auto [k, v] : nb::borrow<nb::dict>(feeds)) {
      std::string name = nb::cast<std::string>(k);
      torch |= !capsules && is_torch(v);
      by_name[name] = to_tensor(v, "input '" + name + "'");
    }
    std::vector<Tensor> out;
    {
      nb::gil_scoped_release release;
      out = s.run(by_name);
    }
    return wrap(out);
  }
  for (nb::handle v : feeds) {
    if (nb::isinstance<Stash>(v)) {  // a stash from an earlier run: its tensors, in order
      Stash& kept = nb::cast<Stash&>(v);
      if (kept.tensors.empty())
        throw InputError(str_cat("input ", inputs.size(),
                                 ": this Stash was fed to an earlier run, which took its tensors "
                                 "(a Stash feeds one run)"));
      // Taken over by the run, which frees each after its last reader.
      inputs.insert(inputs.end(), std::make_move_iterator(kept.tensors.begin()),
                    std::make_move_iterator(kept.tensors.end()));
      kept.tensors.clear();
      continue;
    }
    torch |= !capsules && is_torch(v);
    size_t i = inputs.size();
    inputs.push_back(to_tensor(v, [&] {
      std::vector<std::string> names = s.input_names();
      return "input " + std::to_string(i) + (i < names.size() ? " '" + names[i] + "'" : "");
    }));
  }
  std::vector<Tensor> out;
  {
    nb::gil_scoped_release release;
    out = s.run(std::move(inputs));
  }
  return wrap(out);
}

// A loaded model for inspection: shapes, verification, saving.
struct Model {
  Graph graph;
};

// A Session with, optionally, a thread pool of its own (num_threads > 0).
struct PySession {
  std::unique_ptr<ThreadPool> pool;
  std::unique_ptr<Session> session;

  SessionOptions options(int num_threads) {
    SessionOptions o;
    if (num_threads > 0) {
      pin_blas_to_one_thread();
      pool = std::make_unique<ThreadPool>(num_threads);
      o.pool = pool.get();
    }
    return o;
  }
};

nb::dict value_types(const Graph& g) {
  nb::dict out;
  auto add = [&](const Value* v) {
    nb::list dims;
    if (v->type.shape)
      for (const SymDim& d : *v->type.shape) {
        if (auto c = d.constant())
          dims.append(*c);
        else
          dims.append(d.to_string());
      }
    out[nb::str(v->name().c_str())] =
        nb::make_tuple(to_string(v->type.dtype), v->type.shape ? nb::object(dims) : nb::none());
  };
  for (Value* v : g.inputs()) add(v);
  for (Node* n : g.nodes())
    for (Value* v : n->outputs())
      if (v) add(v);
  return out;
}

}  // namespace

Tensor array_to_tensor(nb::handle obj, const std::string& what) {
  return to_tensor(obj, what);
}

nb::object tensor_to_numpy_copy(const Tensor& t) {
  return to_python(t.clone(), Results::kNumpy);
}

nb::object tensor_to_torch(const Tensor& t) {
  return to_python(t, Results::kTorch);
}

void bind_engine(nb::module_& m) {
  nb::class_<PySession>(m, "Session")
      .def(
          "__init__",
          [](PySession* self, const std::string& path, int num_threads) {
            new (self) PySession();
            SessionOptions options = self->options(num_threads);
            nb::gil_scoped_release release;
            self->session = std::make_unique<Session>(path, options);
          },
          nb::arg("path"), nb::arg("num_threads") = 0,
          "Loads and plans an ONNX model. num_threads > 0 gives the session a thread pool of "
          "its own; 0 uses graphtrain's pool (GRAPHTRAIN_NUM_THREADS).")
      .def(
          "__init__",
          [](PySession* self, const Model& model, int num_threads) {
            new (self) PySession();
            SessionOptions options = self->options(num_threads);
            Graph copy = clone_graph(model.graph);
            nb::gil_scoped_release release;
            self->session = std::make_unique<Session>(std::move(copy), options);
          },
          nb::arg("model"), nb::arg("num_threads") = 0, "Plans an in-memory Model.")
      .def_prop_ro("input_names", [](const PySession& s) { return s.session->input_names(); })
      .def_prop_ro(
          "calls_back",
          [](const PySession& s) {
            for (const Node* n : s.session->graph().nodes())
              if (is_callback_op(*n)) return true;
            return false;
          },
          "Whether the graph has callback nodes (hooks, PythonOps, ATen fallbacks, ZeRO-3 "
          "gathers): a run of it calls into Python.")
      .def_prop_ro("output_names", [](const PySession& s) { return s.session->output_names(); })
      .def(
          "run", [](PySession& s, nb::handle feeds) { return run_session(*s.session, feeds); },
          nb::arg("feeds"),
          "Runs the model on a dict {name: array} or a list in input order; returns the outputs "
          "as numpy arrays, or as torch tensors when any input was one.")
      .def(
          "run_dlpack",
          [](PySession& s, nb::handle feeds, size_t keep) {
            return run_session(*s.session, feeds, true, keep);
          },
          nb::arg("feeds"), nb::arg("keep") = 0,
          "run, for callers that convert themselves: inputs as arrays, tensors, DLPack capsules "
          "(torch.utils.dlpack.to_dlpack) or Stash objects (each stands for its tensors, in "
          "order, and is consumed: the run takes its tensors and frees each after its last "
          "reader); outputs as DLPack capsules, except the last `keep`, which stay in C++ as one "
          "Stash at the end of the list.");

  nb::class_<Stash>(m, "Stash",
                    "Engine tensors kept in C++ between runs (Session.run_dlpack's `keep`).")
      .def("__len__", [](const Stash& s) { return s.tensors.size(); })
      .def(
          "share", [](const Stash& s) { return Stash{s.tensors}; },
          "A second Stash of the same tensors (no copy of their data): a run it feeds takes "
          "these, and this one still holds them for a later run (a backward with "
          "retain_graph=True).")
      .def_prop_ro(
          "nbytes",
          [](const Stash& s) {
            size_t n = 0;
            for (const Tensor& t : s.tensors) n += t.nbytes();
            return n;
          },
          "Bytes of the tensors' data.");

  nb::class_<Model>(m, "Model")
      .def(
          "__init__",
          [](Model* self, const std::string& path) { new (self) Model{load_onnx(path)}; },
          nb::arg("path"))
      .def_static(
          "from_bytes",
          [](nb::bytes data) { return Model{parse_onnx(std::string(data.c_str(), data.size()))}; })
      .def_prop_ro("num_nodes", [](const Model& self) { return self.graph.num_nodes(); })
      .def_prop_ro("input_names",
                   [](const Model& self) {
                     std::vector<std::string> out;
                     for (Value* v : self.graph.inputs()) out.push_back(v->name());
                     return out;
                   })
      .def_prop_ro("output_names",
                   [](const Model& self) {
                     std::vector<std::string> out;
                     for (Value* v : self.graph.outputs()) out.push_back(v->name());
                     return out;
                   })
      .def("verify", [](const Model& self) { verify(self.graph); })
      .def("infer_shapes", [](Model& self) { infer_shapes(self.graph); })
      .def(
          "value_types", [](const Model& self) { return value_types(self.graph); },
          "name -> (dtype, dims or None); dims are ints or symbolic expressions")
      .def(
          "nodes",
          [](const Model& self, const std::string& op_type, const std::string& domain) {
            nb::list out;
            for (Node* n : self.graph.nodes())
              if (n->op_type == op_type && n->domain == domain)
                out.append(nb::make_tuple(n->scope, attributes_of(*n)));
            return out;
          },
          nb::arg("op_type"), nb::arg("domain") = "",
          "[(module scope, {attribute: value})] of the nodes of one op, in graph order; tensor "
          "attributes are left out.")
      .def("ops",
           [](const Model& self) {
             std::vector<std::string> out;
             for (Node* n : self.graph.topological_order()) out.push_back(n->qualified_op());
             return out;
           })
      .def(
          "save",
          [](const Model& self, const std::string& path, size_t external_threshold) {
            SaveOptions opt;
            opt.external_data_threshold = external_threshold;
            save_onnx(self.graph, path, opt);
          },
          nb::arg("path"), nb::arg("external_data_threshold") = 0)
      .def(
          "gradient_graphs",
          [](const Model& self, const std::vector<std::string>& outputs,
             const std::vector<std::string>& wrt, bool seed_with_ones) {
            GradientGraphs gg = build_gradient_graphs(self.graph, {outputs, seed_with_ones, wrt});
            nb::dict info;
            info["stashed"] = gg.stashed;
            info["grad_inputs"] = gg.grad_inputs;
            info["grads"] = gg.grads;
            return nb::make_tuple(Model{std::move(gg.forward)}, Model{std::move(gg.backward)},
                                  info);
          },
          nb::arg("outputs"), nb::arg("wrt"), nb::arg("seed_with_ones") = false,
          "Builds (forward, backward, info): the forward graph also returns info['stashed']; the "
          "backward graph takes info['grad_inputs'] then the stashed values and returns the "
          "gradients named in info['grads'] ('' where an input gets none).")
      .def(
          "optimize",
          [](Model& self, const std::string& label, bool before_autodiff) {
            return optimize_graph(self.graph, label, before_autodiff);
          },
          nb::arg("label") = "graph", nb::arg("before_autodiff") = false,
          "Runs the graph passes in place (GRAPHTRAIN_ENABLE_COMPUTE_OPTIMIZER, "
          "GRAPHTRAIN_DISABLE_PASSES); with before_autodiff, those that run on a captured graph "
          "before its gradient graphs are built. Returns [(pass, rewrites)] for the passes that "
          "ran.")
      .def(
          "copy", [](const Model& self) { return Model{clone_graph(self.graph)}; },
          "A copy of the graph (initializers share their tensors).")
      .def(
          "drop_zero_gradients",
          [](Model& self, const std::vector<std::string>& zero_inputs) {
            return drop_zero_gradients(self.graph, zero_inputs);
          },
          nb::arg("zero_inputs"),
          "In a backward graph, drops the sums that add these gradient inputs, known to be zero, "
          "to another value; returns how many.")
      .def("to_bytes", [](const Model& self) {
        std::string s = serialize_onnx(self.graph);
        return nb::bytes(s.data(), s.size());
      });

  m.def("supported_ops", [] { return registered_ops("cpu"); });
  m.def(
      "pass_names",
      [] {
        std::vector<std::string> names;
        for (const Pass& p : pass_pipeline()) names.push_back(p.name);
        return names;
      },
      "The graph passes, in the order they run.");

  // The kernel profiler (GRAPHTRAIN_PROFILE); graphtrain.profile_summary() formats its totals.
  m.def("profile_start", [] { Profiler::global().start(); });
  m.def("profile_stop", [] { Profiler::global().stop(); });
  m.def("profile_clear", [] { Profiler::global().clear(); });
  m.def("profile_active", [] { return Profiler::global().active(); });
  m.def(
      "profile_rows",
      [](const std::string& by) {
        if (by != "op" && by != "module")
          throw InputError("profile rows are by 'op' or by 'module', not '" + by + "'");
        std::vector<std::tuple<std::string, double, int64_t>> out;
        for (const ProfileRow& r :
             by == "op" ? Profiler::global().by_op() : Profiler::global().by_module())
          out.emplace_back(r.key, r.ms, r.calls);
        return out;
      },
      nb::arg("by"), "[(op or module, milliseconds, calls)], largest first");
  m.def(
      "profile_write", [](const std::string& path) { Profiler::global().write(path); },
      nb::arg("path"), "Writes the Chrome trace of everything recorded so far, atomically.");
}

}  // namespace graphtrain::bindings
