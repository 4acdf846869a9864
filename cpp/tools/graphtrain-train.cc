// graphtrain-train: trains an ONNX model on arrays from an .npz file, with no Python.
//
//   graphtrain-train MODEL.onnx --data DATA.npz [--loss NAME] [--steps N] [--batch-size B]
//                    [--lr LR] [--optimizer adamw|sgd] [--momentum M] [--weight-decay WD]
//                    [--checkpoint PATH] [--save-every N] [--out PATH] [--seed S]
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "graphtrain/error.h"
#include "graphtrain/npz.h"
#include "graphtrain/strings.h"
#include "graphtrain/training_session.h"

using namespace graphtrain;

namespace {

const char* kUsage =
    "usage: graphtrain-train MODEL.onnx --data DATA.npz [options]\n"
    "\n"
    "Trains the model's trainable initializers on named arrays from DATA.npz (each array feeds "
    "the\n"
    "graph input of the same name; all share their first dimension, the examples).\n"
    "\n"
    "options:\n"
    "  --loss NAME          the scalar loss output (default: the model's only output)\n"
    "  --steps N            optimizer steps to reach (default 100)\n"
    "  --batch-size B       examples per step, shuffled each epoch (default 32; 0: all)\n"
    "  --lr LR              learning rate (default 1e-3)\n"
    "  --optimizer NAME     adamw (default) or sgd\n"
    "  --momentum M         SGD momentum (default 0)\n"
    "  --weight-decay WD    weight decay (default 0.01)\n"
    "  --checkpoint PATH    resume from PATH if it exists; save to it at the end\n"
    "  --save-every N       also save the checkpoint every N steps\n"
    "  --out PATH           write the trained model as a plain ONNX file\n"
    "  --seed S             shuffling seed (default 0)\n";

[[noreturn]] void usage_error(const std::string& message) {
  std::fprintf(stderr, "graphtrain-train: error: %s\n\n%s", message.c_str(), kUsage);
  std::exit(2);
}

struct Args {
  std::string model, data, loss, optimizer = "adamw", checkpoint, out;
  int64_t steps = 100, batch = 32, save_every = 0;
  uint64_t seed = 0;
  double lr = 1e-3, momentum = 0.0, weight_decay = 0.01;
};

double to_number(const std::string& flag, const std::string& value) {
  try {
    size_t used = 0;
    double v = std::stod(value, &used);
    if (used != value.size()) throw std::invalid_argument(value);
    return v;
  } catch (const std::exception&) {
    usage_error(flag + " needs a number, got '" + value + "'");
  }
}

Args parse(int argc, char** argv) {
  Args a;
  std::vector<std::string> rest(argv + 1, argv + argc);
  for (size_t i = 0; i < rest.size(); ++i) {
    const std::string& f = rest[i];
    if (f == "-h" || f == "--help") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    }
    if (f.rfind("--", 0) != 0) {
      if (!a.model.empty())
        usage_error("more than one model given ('" + a.model + "', '" + f + "')");
      a.model = f;
      continue;
    }
    if (i + 1 >= rest.size()) usage_error(f + " needs a value");
    const std::string& v = rest[++i];
    if (f == "--data")
      a.data = v;
    else if (f == "--loss")
      a.loss = v;
    else if (f == "--optimizer")
      a.optimizer = v;
    else if (f == "--checkpoint")
      a.checkpoint = v;
    else if (f == "--out")
      a.out = v;
    else if (f == "--steps")
      a.steps = static_cast<int64_t>(to_number(f, v));
    else if (f == "--batch-size")
      a.batch = static_cast<int64_t>(to_number(f, v));
    else if (f == "--save-every")
      a.save_every = static_cast<int64_t>(to_number(f, v));
    else if (f == "--seed")
      a.seed = static_cast<uint64_t>(to_number(f, v));
    else if (f == "--lr")
      a.lr = to_number(f, v);
    else if (f == "--momentum")
      a.momentum = to_number(f, v);
    else if (f == "--weight-decay")
      a.weight_decay = to_number(f, v);
    else
      usage_error("unknown option " + f);
  }
  if (a.model.empty()) usage_error("no model given");
  if (a.data.empty()) usage_error("no data given (--data DATA.npz)");
  if (a.steps < 0 || a.batch < 0) usage_error("--steps and --batch-size must not be negative");
  return a;
}

// Rows `rows` of a tensor whose first dim indexes examples.
Tensor take_rows(const Tensor& t, const std::vector<int64_t>& rows) {
  Shape s = t.shape();
  s[0] = static_cast<int64_t>(rows.size());
  Tensor out = Tensor::empty(t.dtype(), s);
  size_t row_bytes = t.dim(0) ? t.nbytes() / static_cast<size_t>(t.dim(0)) : 0;
  for (size_t i = 0; i < rows.size(); ++i)
    std::memcpy(static_cast<char*>(out.raw_data()) + i * row_bytes,
                static_cast<const char*>(t.raw_data()) + static_cast<size_t>(rows[i]) * row_bytes,
                row_bytes);
  return out;
}

void progress(int64_t step, int64_t total, float loss, double rate, bool tty, bool last) {
  int64_t width = 30;
  int64_t filled = total ? step * width / total : width;
  std::string bar(static_cast<size_t>(filled), '#');
  bar.resize(static_cast<size_t>(width), '.');
  if (tty) {
    std::fprintf(stderr, "\rstep %lld/%lld [%s] loss %.5f  %.1f steps/s%s",
                 static_cast<long long>(step), static_cast<long long>(total), bar.c_str(), loss,
                 rate, last ? "\n" : "");
  } else {
    std::fprintf(stderr, "step %lld/%lld [%s] loss %.5f  %.1f steps/s\n",
                 static_cast<long long>(step), static_cast<long long>(total), bar.c_str(), loss,
                 rate);
  }
  std::fflush(stderr);
}

int run(const Args& a) {
  std::map<std::string, Tensor> data = load_npz(a.data);
  TrainingConfig cfg;
  cfg.loss = a.loss;
  cfg.optimizer = {a.optimizer, a.lr, a.weight_decay, 0.9, 0.999, 1e-8, a.momentum};
  TrainingSession ts(a.model, cfg);
  // Map arrays to inputs.
  std::string arrays;
  for (const auto& [name, t] : data) arrays += (arrays.empty() ? "" : ", ") + name;
  int64_t examples = -1;
  for (const auto& input : ts.data_inputs()) {
    auto it = data.find(input);
    if (it == data.end())
      throw InputError("model input '" + input + "' has no array in '" + a.data +
                       "' (its arrays: " + arrays + ")");
    if (it->second.rank() == 0)
      throw InputError("array '" + input + "' is a scalar; its first dim must index examples");
    if (examples >= 0 && it->second.dim(0) != examples)
      throw InputError(str_cat("array '", input, "' has ", it->second.dim(0),
                               " examples, the others ", examples));
    examples = it->second.dim(0);
  }
  for (const auto& [name, t] : data)
    if (std::find(ts.data_inputs().begin(), ts.data_inputs().end(), name) == ts.data_inputs().end())
      std::fprintf(stderr,
                   "graphtrain-train: warning: array '%s' is not an input of the model; ignored\n",
                   name.c_str());
  if (examples <= 0) throw InputError("the data holds no examples");
  if (!a.checkpoint.empty() && std::filesystem::exists(a.checkpoint)) {
    ts.load_checkpoint(a.checkpoint);
    std::fprintf(stderr, "resumed from '%s' at step %lld\n", a.checkpoint.c_str(),
                 static_cast<long long>(ts.optimizer_steps()));
  }
  int64_t batch = a.batch == 0 ? examples : std::min(a.batch, examples);
  std::vector<int64_t> order(static_cast<size_t>(examples));
  std::iota(order.begin(), order.end(), 0);
  std::mt19937_64 rng(a.seed);
  // Resuming continues the same example sequence: replay the shuffles of the finished epochs.
  int64_t per_epoch = examples / batch;
  int64_t start = ts.optimizer_steps();
  for (int64_t e = 0; e <= start / per_epoch; ++e) std::shuffle(order.begin(), order.end(), rng);
  int64_t cursor = (start % per_epoch) * batch;
  bool tty = isatty(2);
  auto t0 = std::chrono::steady_clock::now();
  int64_t report = std::max<int64_t>(1, (a.steps - start) / 10);
  float loss = 0;
  for (int64_t step = start; step < a.steps; ++step) {
    if (cursor + batch > examples) {
      std::shuffle(order.begin(), order.end(), rng);
      cursor = 0;
    }
    std::vector<int64_t> rows(order.begin() + cursor, order.begin() + cursor + batch);
    cursor += batch;
    std::map<std::string, Tensor> feeds;
    for (const auto& input : ts.data_inputs()) feeds[input] = take_rows(data[input], rows);
    ts.zero_grad();
    loss = ts.train_step(feeds);
    ts.optimizer_step();
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    int64_t done = step + 1;
    if (tty || (done - start) % report == 0 || done == a.steps)
      progress(done, a.steps, loss, static_cast<double>(done - start) / std::max(secs, 1e-9), tty,
               done == a.steps);
    if (a.save_every > 0 && done % a.save_every == 0 && !a.checkpoint.empty())
      ts.save_checkpoint(a.checkpoint);
  }
  if (!a.checkpoint.empty()) ts.save_checkpoint(a.checkpoint);
  if (!a.out.empty()) {
    ts.export_for_inference(a.out);
    std::fprintf(stderr, "wrote the trained model to '%s'\n", a.out.c_str());
  }
  std::printf("final loss %.6f after %lld steps\n", loss,
              static_cast<long long>(ts.optimizer_steps()));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args args = parse(argc, argv);
  try {
    return run(args);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "graphtrain-train: error: %s\n", e.what());
    return 1;
  }
}
