// Gradient rules: the random generators pass no gradient to their input (its shape, or the
// probabilities of Bernoulli), as in torch, where rand_like and bernoulli are not differentiable.
#include "graphtrain/autodiff.h"

namespace graphtrain {
namespace {

const bool registered = [] {
  for (const char* op : {"RandomUniformLike", "RandomNormalLike", "Bernoulli"})
    register_gradient("", op, [](GradientContext&) {});
  return true;
}();

}  // namespace
}  // namespace graphtrain
