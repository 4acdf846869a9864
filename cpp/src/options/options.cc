#include "graphtrain/options.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdlib>

#include "graphtrain/error.h"

namespace graphtrain {
namespace {

std::string upper(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return out;
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

std::string join(const std::vector<std::string>& items, const char* sep) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i) out += sep;
    out += items[i];
  }
  return out;
}

[[noreturn]] void reject(const OptionSpec& spec, std::string_view raw, std::string_view origin,
                         const std::string& accepted) {
  throw OptionError(std::string(origin) + "='" + std::string(raw) + "' is not a valid value for " +
                    "option '" + spec.name + "' (" + spec.doc + "); accepted: " + accepted + ".");
}

}  // namespace

const char* to_string(OptionType type) {
  switch (type) {
    case OptionType::kBool:
      return "bool";
    case OptionType::kInt:
      return "int";
    case OptionType::kString:
      return "string";
    case OptionType::kEnum:
      return "enum";
    case OptionType::kPath:
      return "path";
  }
  return "?";
}

const char* to_string(OptionSource source) {
  switch (source) {
    case OptionSource::kDefault:
      return "default";
    case OptionSource::kEnv:
      return "env";
    case OptionSource::kApi:
      return "api";
  }
  return "?";
}

std::vector<OptionSpec> Options::builtin_specs() {
  using T = OptionType;
  auto spec = [](const char* name, T type, const char* def, const char* env, const char* doc,
                 std::vector<std::string> choices = {}, int64_t lo = 0, int64_t hi = 0) {
    return OptionSpec{name, type, def, env, doc, std::move(choices), lo, hi};
  };
  return {
      spec("log_level", T::kEnum, "WARNING", "GRAPHTRAIN_LOG_LEVEL",
           "Lowest severity logged; at WARNING and above only rank 0 logs (errors excepted), at "
           "INFO and below every rank logs, tagged [rank N].",
           {"VERBOSE", "DEVINFO", "INFO", "WARNING", "ERROR", "FATAL"}),
      spec("cache_dir", T::kPath, "", "GRAPHTRAIN_CACHE_DIR",
           "Folder of the on-disk cache of captured graphs; empty disables the cache "
           "(GraphModule)."),
      spec("capture_process", T::kBool, "1", "GRAPHTRAIN_CAPTURE_PROCESS",
           "Capture in a forked child process, so torch.export and the ATen translators (~30 MiB "
           "with what a trace allocates) never load into the training process; "
           "0 captures in this process, as GraphModule does off Linux, with CUDA initialized or "
           "under torch.distributed (GraphModule)."),
      spec("flush_denormals", T::kBool, "1", "GRAPHTRAIN_FLUSH_DENORMALS",
           "Graph runs treat denormal floats (magnitudes below 1.2e-38) as zero (x86 FTZ/DAZ, "
           "set for the run and restored after): arithmetic on them is 10-100x slower on Intel "
           "CPUs, and a softmax or an optimizer's running averages make them; 0 keeps "
           "them, as PyTorch does by default."),
      spec("fallback_policy", T::kEnum, "ATEN", "GRAPHTRAIN_FALLBACK_POLICY",
           "ATEN runs an op without a native kernel through PyTorch's kernel inside the graph "
           "(one warning names them); OFF raises an error naming the op and its "
           "module; EAGER runs the whole module in plain PyTorch, with one warning (GraphModule).",
           {"ATEN", "OFF", "EAGER"}),
      spec("enable_custom_autograd", T::kBool, "1", "GRAPHTRAIN_ENABLE_CUSTOM_AUTOGRAD",
           "Keep torch.autograd.Function calls opaque as PythonOp nodes; 0 traces through them "
           "(PythonOp)."),
      spec("enable_compute_optimizer", T::kBool, "1", "GRAPHTRAIN_ENABLE_COMPUTE_OPTIMIZER",
           "Run the graph passes (cpp/src/passes/) on the captured graph and on the forward and "
           "backward graphs; 0 runs none, for an exact-parity run (passes)."),
      spec("disable_passes", T::kString, "", "GRAPHTRAIN_DISABLE_PASSES",
           "Comma-separated passes not to run: recognize_gelu, recognize_rms_norm, "
           "recognize_rotary, recognize_silu_mul, fold_pad_into_conv, recognize_attention, "
           "fuse_loss_gradient, stash_gelu_derivative, identities, constant_folding, dead_code, "
           "fold_transposes, "
           "fuse_softmax, fuse_layer_norm, gelu_grad_from_output, fuse_elementwise, memory_plan "
           "(passes)."),
      spec("save_onnx_path", T::kPath, "", "GRAPHTRAIN_SAVE_ONNX_PATH",
           "Folder where captured and optimized graphs are saved as .onnx files; empty saves none "
           "(GraphModule)."),
      spec("num_threads", T::kInt, "0", "GRAPHTRAIN_NUM_THREADS",
           "Threads in graphtrain's thread pool; 0 uses one per core (engine).", {}, 0, 4096),
      spec("conv_algorithm", T::kEnum, "AUTO", "GRAPHTRAIN_CONV_ALGORITHM",
           "AUTO runs depthwise convolutions (one filter per channel) on graphtrain's direct "
           "kernels, others on oneDNN's direct kernels where it has one for the shape "
           "(built with oneDNN), else, and for small ones (at most 2048 weights), im2col + GEMM; "
           "ONEDNN on oneDNN wherever it has a kernel, whatever the size; IM2COL always im2col + "
           "GEMM (engine).",
           {"AUTO", "ONEDNN", "IM2COL"}),
      spec("enable_zero_stage3", T::kBool, "0", "GRAPHTRAIN_ENABLE_ZERO_STAGE3",
           "GraphModule shards its model's parameters, gradients and optimizer state across "
           "the ranks of torch.distributed (graphtrain.distributed.zero3; build the optimizer "
           "after the GraphModule)."),
      spec("print_memory_stats", T::kBool, "0", "GRAPHTRAIN_PRINT_MEMORY_STATS",
           "Log the planned and peak memory of each execution plan at INFO (runtime)."),
      spec("eager_modules", T::kString, "", "GRAPHTRAIN_EAGER_MODULES",
           "Comma-separated submodule paths (as in named_modules()) that run in plain PyTorch "
           "inside every GraphModule's graph, eager islands; added to eager_modules= "
           "(GraphModule)."),
      spec("disable", T::kBool, "0", "GRAPHTRAIN_DISABLE",
           "Every GraphModule runs its module in plain PyTorch, a pass-through: the baseline run "
           "of a comparison, with no code change (GraphModule)."),
      spec("stats_dir", T::kPath, "", "GRAPHTRAIN_STATS_DIR",
           "Dump statistics of every GraphModule's module outputs, their gradients and the "
           "parameter gradients into this new folder (binary only; graphtrain-stats text renders "
           "the text files), pass-through included (statistics)."),
      spec("stats_steps", T::kInt, "0", "GRAPHTRAIN_STATS_STEPS",
           "With GRAPHTRAIN_STATS_DIR, dump the first N steps only; 0 dumps every step "
           "(statistics).",
           {}, 0, int64_t{1} << 40),
      spec("test_break_pass", T::kString, "", "GRAPHTRAIN_TEST_BREAK_PASS",
           "TEST ONLY, never for training: after the named pass, the first node it created gives "
           "a wrong result (its first output times 1.01), so tests can check that "
           "graphtrain-stats bisect names the pass (passes)."),
      spec("profile", T::kPath, "", "GRAPHTRAIN_PROFILE",
           "Record every kernel run (op, node, module, input shapes) and write a Chrome trace "
           "to this .json file at exit; graphtrain.profile_summary() prints time by op and by "
           "module (runtime)."),
  };
}

std::string Options::canonicalize(const OptionSpec& spec, std::string_view raw,
                                  std::string_view origin) {
  std::string_view v = trim(raw);
  switch (spec.type) {
    case OptionType::kBool: {
      std::string l = lower(v);
      if (l == "1" || l == "true") return "1";
      if (l == "0" || l == "false") return "0";
      reject(spec, raw, origin, "0, 1, true, false (any case)");
    }
    case OptionType::kInt: {
      int64_t n = 0;
      auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
      std::string range = "an integer from " + std::to_string(spec.min_value) + " to " +
                          std::to_string(spec.max_value);
      if (v.empty() || ec != std::errc() || end != v.data() + v.size() || n < spec.min_value ||
          n > spec.max_value)
        reject(spec, raw, origin, range);
      return std::to_string(n);
    }
    case OptionType::kEnum: {
      std::string u = upper(v);
      for (const auto& choice : spec.choices)
        if (u == choice) return choice;
      reject(spec, raw, origin, join(spec.choices, ", ") + " (any case)");
    }
    case OptionType::kPath: {
      std::string path(v);
      if (path.find('\0') != std::string::npos) reject(spec, raw, origin, "a path without NUL");
      if (path.size() >= 2 && path[0] == '~' && path[1] == '/') {
        const char* home = std::getenv("HOME");
        if (home) path = std::string(home) + path.substr(1);
      }
      return path;
    }
    case OptionType::kString:
      return std::string(raw);
  }
  return std::string(raw);
}

Options::Options(std::vector<OptionSpec> specs, const char* (*getenv_fn)(const char*))
    : specs_(std::move(specs)), getenv_(getenv_fn) {
  values_.reserve(specs_.size());
  for (const auto& spec : specs_)
    values_.push_back({&spec, spec.default_value, OptionSource::kDefault});
  reload();
}

Options& Options::global() {
  static Options instance(builtin_specs(),
                          [](const char* name) -> const char* { return std::getenv(name); });
  return instance;
}

size_t Options::index_of(std::string_view name) const {
  for (size_t i = 0; i < specs_.size(); ++i)
    if (specs_[i].name == name || specs_[i].env == name) return i;
  std::vector<std::string> names;
  for (const auto& spec : specs_) names.push_back(spec.name);
  throw OptionError("no runtime option named '" + std::string(name) +
                    "'; known options: " + join(names, ", ") + ".");
}

std::vector<OptionValue> Options::values() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return values_;
}

OptionValue Options::get(std::string_view name) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return values_[index_of(name)];
}

std::string Options::typed(std::string_view name, OptionType a, OptionType b) const {
  OptionValue v = get(name);
  if (v.spec->type != a && v.spec->type != b)
    throw OptionError("option '" + v.spec->name + "' is of type " + to_string(v.spec->type) +
                      ", not " + to_string(a));
  return v.value;
}

bool Options::get_bool(std::string_view name) const {
  return typed(name, OptionType::kBool, OptionType::kBool) == "1";
}

int64_t Options::get_int(std::string_view name) const {
  return std::stoll(typed(name, OptionType::kInt, OptionType::kInt));
}

std::string Options::get_string(std::string_view name) const {
  OptionValue v = get(name);
  if (v.spec->type == OptionType::kBool || v.spec->type == OptionType::kInt)
    throw OptionError("option '" + v.spec->name + "' is of type " + to_string(v.spec->type) +
                      ", not a string");
  return v.value;
}

void Options::set(std::string_view name, std::string_view value) {
  OptionValue changed;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    OptionValue& v = values_[index_of(name)];
    v.value = canonicalize(*v.spec, value, "the API: " + v.spec->name);
    v.source = OptionSource::kApi;
    changed = v;
  }
  notify({changed});
}

void Options::reload() {
  // Validate every variable before changing anything, so one bad value leaves the registry intact.
  std::vector<OptionValue> fresh;
  for (const auto& spec : specs_) {
    const char* raw = getenv_(spec.env.c_str());
    if (raw == nullptr)
      fresh.push_back({&spec, spec.default_value, OptionSource::kDefault});
    else
      fresh.push_back({&spec, canonicalize(spec, raw, spec.env), OptionSource::kEnv});
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    values_ = fresh;
  }
  notify(fresh);
}

void Options::add_listener(Listener listener) {
  std::lock_guard<std::mutex> lock(mutex_);
  listeners_.push_back(listener);
}

void Options::notify(const std::vector<OptionValue>& changed) {
  std::vector<Listener> listeners;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    listeners = listeners_;
  }
  for (const auto& v : changed)
    for (Listener l : listeners) l(v);
}

}  // namespace graphtrain
