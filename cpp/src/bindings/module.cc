#include "bindings/bindings.h"

NB_MODULE(_C, m) {
  m.doc() = "graphtrain's C++ engine";
  graphtrain::bindings::bind_errors(m);
  graphtrain::bindings::bind_options(m);
  graphtrain::bindings::bind_log(m);
  graphtrain::bindings::bind_engine(m);
  graphtrain::bindings::bind_training(m);
}
