// graphtrain.engine.TrainingSession: train an ONNX model in the engine.
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstring>

#include "bindings/bindings.h"
#include "graphtrain/training_session.h"

namespace nb = nanobind;

namespace graphtrain::bindings {
namespace {

std::map<std::string, Tensor> to_feeds(nb::dict feeds) {
  std::map<std::string, Tensor> out;
  for (auto [k, v] : feeds) {
    std::string name = nb::cast<std::string>(k);
    out[name] = array_to_tensor(v, "input '" + name + "'");
  }
  return out;
}

}  // namespace

void bind_training(nb::module_& m) {
  nb::class_<TrainingSession>(m, "TrainingSession")
      .def(
          "__init__",
          [](TrainingSession* self, const std::string& path, const std::string& loss,
             const std::vector<std::string>& trainable, const std::string& optimizer, double lr,
             double weight_decay, double beta1, double beta2, double eps, double momentum) {
            TrainingConfig cfg;
            cfg.loss = loss;
            cfg.trainable = trainable;
            cfg.optimizer = {optimizer, lr, weight_decay, beta1, beta2, eps, momentum};
            nb::gil_scoped_release release;
            new (self) TrainingSession(path, cfg);
          },
          nb::arg("path"), nb::arg("loss") = "", nb::arg("trainable") = std::vector<std::string>{},
          nb::arg("optimizer") = "adamw", nb::arg("lr") = 1e-3, nb::arg("weight_decay") = 0.01,
          nb::arg("beta1") = 0.9, nb::arg("beta2") = 0.999, nb::arg("eps") = 1e-8,
          nb::arg("momentum") = 0.0,
          "Opens an ONNX model for training: `loss` names the scalar loss output (default: the "
          "only "
          "output), `trainable` the initializers to train (default: every float32 initializer).")
      .def(
          "train_step",
          [](TrainingSession& s, nb::dict feeds) {
            auto f = to_feeds(feeds);
            nb::gil_scoped_release release;
            return s.train_step(f);
          },
          nb::arg("feeds"), "Forward and backward; returns the loss, adds to the gradients.")
      .def(
          "eval_step",
          [](TrainingSession& s, nb::dict feeds) {
            auto f = to_feeds(feeds);
            nb::gil_scoped_release release;
            return s.eval_step(f);
          },
          nb::arg("feeds"))
      .def("optimizer_step", &TrainingSession::optimizer_step,
           nb::call_guard<nb::gil_scoped_release>())
      .def("zero_grad", &TrainingSession::zero_grad)
      .def("save_checkpoint", &TrainingSession::save_checkpoint, nb::arg("path"))
      .def("load_checkpoint", &TrainingSession::load_checkpoint, nb::arg("path"))
      .def("export_for_inference", &TrainingSession::export_for_inference, nb::arg("path"))
      .def_prop_ro("data_inputs", &TrainingSession::data_inputs)
      .def_prop_ro("parameter_names", &TrainingSession::parameter_names)
      .def_prop_ro("stashed", &TrainingSession::stashed)
      .def_prop_ro("optimizer_steps", &TrainingSession::optimizer_steps)
      .def(
          "parameter",
          [](const TrainingSession& s, const std::string& n) {
            return tensor_to_numpy_copy(s.parameter(n));
          },
          nb::arg("name"), "A copy of a parameter as a numpy array.")
      .def(
          "gradient",
          [](const TrainingSession& s, const std::string& n) {
            return tensor_to_numpy_copy(s.gradient(n));
          },
          nb::arg("name"), "A copy of a parameter's accumulated gradient.");
}

}  // namespace graphtrain::bindings
