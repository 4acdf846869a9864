#include "bindings/bindings.h"

NB_MODULE(_C, m) {
  m.doc() = "graphtrain's C++ engine";
  // Sessions held by modules and autograd graphs may still be alive while the interpreter shuts
  // down; that is not a leak worth a warning.
  nanobind::set_leak_warnings(false);
  graphtrain::bindings::bind_errors(m);
  graphtrain::bindings::bind_options(m);
  graphtrain::bindings::bind_log(m);
  graphtrain::bindings::bind_engine(m);
  graphtrain::bindings::bind_training(m);
  graphtrain::bindings::bind_stats(m);
  graphtrain::bindings::bind_callbacks(m);
  graphtrain::bindings::bind_optim(m);
}
