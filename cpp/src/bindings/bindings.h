// The Python extension graphtrain._C: each file binds one area of the engine.
#pragma once

#include <nanobind/nanobind.h>

#include <string>

#include "graphtrain/graph.h"
#include "graphtrain/tensor.h"

namespace graphtrain::bindings {

void bind_errors(nanobind::module_& m);
void bind_options(nanobind::module_& m);
void bind_log(nanobind::module_& m);
void bind_engine(nanobind::module_& m);
void bind_training(nanobind::module_& m);
void bind_stats(nanobind::module_& m);
void bind_callbacks(nanobind::module_& m);
void bind_optim(nanobind::module_& m);

// A node's attributes as {name: int, float, str or list}; tensor attributes are left out.
nanobind::dict attributes_of(const Node& node);

// Arrays crossing into the engine (zero copy when contiguous) and back out.
Tensor array_to_tensor(nanobind::handle obj, const std::string& what);
nanobind::object tensor_to_numpy_copy(const Tensor& t);
// A torch tensor sharing the engine tensor's memory (DLPack, zero copy).
nanobind::object tensor_to_torch(const Tensor& t);

}  // namespace graphtrain::bindings
