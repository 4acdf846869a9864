// graphtrain.optim's engine side: fused AdamW and SGD steps over torch's own tensors, given as
// data pointers (the Python side checks that each is a contiguous float32 CPU tensor and keeps
// them alive for the call). AdamW's step counts are the state's 0-d float32 tensors, incremented
// here.
#include <nanobind/stl/vector.h>

#include "bindings/bindings.h"
#include "graphtrain/error.h"
#include "graphtrain/optimizers.h"
#include "graphtrain/strings.h"
#include "graphtrain/thread_pool.h"

namespace nb = nanobind;

namespace graphtrain::bindings {
namespace {

using Pointers = std::vector<uintptr_t>;

float* ptr(const Pointers& v, size_t i) {
  return i < v.size() ? reinterpret_cast<float*>(v[i]) : nullptr;
}

void check_sizes(size_t n, std::initializer_list<std::pair<const char*, size_t>> lists) {
  for (auto [name, size] : lists)
    if (size != n)
      throw InputError(str_cat("optimizer step: ", n, " parameters but ", size, " ", name));
}

}  // namespace

void bind_optim(nb::module_& m) {
  m.def(
      "adamw_step",
      [](const Pointers& params, const Pointers& grads, const Pointers& exp_avgs,
         const Pointers& exp_avg_sqs, const Pointers& max_exp_avg_sqs,
         const std::vector<int64_t>& numels, const Pointers& steps, double lr, double beta1,
         double beta2, double eps, double weight_decay, bool amsgrad, bool maximize) {
        size_t n = params.size();
        check_sizes(n, {{"gradients", grads.size()},
                        {"exp_avg", exp_avgs.size()},
                        {"exp_avg_sq", exp_avg_sqs.size()},
                        {"sizes", numels.size()},
                        {"steps", steps.size()}});
        if (amsgrad) check_sizes(n, {{"max_exp_avg_sq", max_exp_avg_sqs.size()}});
        std::vector<AdamWTensor> tensors;
        for (size_t i = 0; i < n; ++i) {
          float& count = *ptr(steps, i);  // torch's float32 step count: incremented as torch does
          count += 1.0f;
          tensors.push_back({ptr(params, i), ptr(grads, i), ptr(exp_avgs, i), ptr(exp_avg_sqs, i),
                             amsgrad ? ptr(max_exp_avg_sqs, i) : nullptr, numels[i], count});
        }
        AdamWOptions o{lr, beta1, beta2, eps, weight_decay, amsgrad, maximize};
        nb::gil_scoped_release release;
        adamw_step(ThreadPool::global(), tensors, o);
      },
      nb::arg("params"), nb::arg("grads"), nb::arg("exp_avgs"), nb::arg("exp_avg_sqs"),
      nb::arg("max_exp_avg_sqs"), nb::arg("numels"), nb::arg("steps"), nb::arg("lr"),
      nb::arg("beta1"), nb::arg("beta2"), nb::arg("eps"), nb::arg("weight_decay"),
      nb::arg("amsgrad"), nb::arg("maximize"));
  m.def(
      "sgd_step",
      [](const Pointers& params, const Pointers& grads, const Pointers& buffers,
         const std::vector<int64_t>& numels, const std::vector<bool>& first, double lr,
         double momentum, double dampening, double weight_decay, bool nesterov, bool maximize) {
        size_t n = params.size();
        check_sizes(n, {{"gradients", grads.size()}, {"sizes", numels.size()}});
        if (momentum != 0)
          check_sizes(n, {{"momentum buffers", buffers.size()}, {"first flags", first.size()}});
        std::vector<SGDTensor> tensors;
        for (size_t i = 0; i < n; ++i)
          tensors.push_back({ptr(params, i), ptr(grads, i),
                             momentum != 0 ? ptr(buffers, i) : nullptr, numels[i],
                             momentum != 0 && first[i]});
        SGDOptions o{lr, momentum, dampening, weight_decay, nesterov, maximize};
        nb::gil_scoped_release release;
        sgd_step(ThreadPool::global(), tensors, o);
      },
      nb::arg("params"), nb::arg("grads"), nb::arg("buffers"), nb::arg("numels"), nb::arg("first"),
      nb::arg("lr"), nb::arg("momentum"), nb::arg("dampening"), nb::arg("weight_decay"),
      nb::arg("nesterov"), nb::arg("maximize"));
}

}  // namespace graphtrain::bindings
