// The Python extension graphtrain._C: each file binds one area of the engine.
#pragma once

#include <nanobind/nanobind.h>

namespace graphtrain::bindings {

void bind_errors(nanobind::module_& m);
void bind_options(nanobind::module_& m);
void bind_log(nanobind::module_& m);
void bind_engine(nanobind::module_& m);

}  // namespace graphtrain::bindings
