// Runtime options: one typed registry. Effective value = default, then the environment variable,
// then an explicit setting from the API; each value remembers where it came from.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace graphtrain {

enum class OptionType { kBool, kInt, kString, kEnum, kPath };
enum class OptionSource { kDefault, kEnv, kApi };

const char* to_string(OptionType type);
const char* to_string(OptionSource source);

struct OptionSpec {
  std::string name;  // short name, e.g. "log_level"
  OptionType type;
  std::string default_value;         // canonical text form
  std::string env;                   // environment variable, e.g. "GRAPHTRAIN_LOG_LEVEL"
  std::string doc;                   // one line
  std::vector<std::string> choices;  // kEnum only
  int64_t min_value = 0;             // kInt only
  int64_t max_value = 0;             // kInt only
};

// One option's effective value in canonical text form ("1"/"0" for booleans, upper-case enum
// names as declared, decimal integers).
struct OptionValue {
  const OptionSpec* spec;
  std::string value;
  OptionSource source;
};

class Options {
 public:
  // The process-wide registry. The first call reads and validates the environment; a bad value
  // throws OptionError naming the variable, the value and what is accepted.
  static Options& global();

  // A registry over the given specs, reading the environment through `getenv` (tests use this).
  Options(std::vector<OptionSpec> specs, const char* (*getenv_fn)(const char*));

  Options(const Options&) = delete;
  Options& operator=(const Options&) = delete;

  // Snapshots: safe to call while another thread sets an option.
  std::vector<OptionValue> values() const;
  OptionValue get(std::string_view name) const;

  bool get_bool(std::string_view name) const;
  int64_t get_int(std::string_view name) const;
  std::string get_string(std::string_view name) const;  // string, enum and path

  // Explicit setting from the API; validated like an environment value. Source becomes kApi.
  void set(std::string_view name, std::string_view value);
  // Forgets API settings and re-reads the environment for every option.
  void reload();

  // Called with each option's new value after set() or reload(), outside the registry's lock;
  // components that cache an option (the logger's level) keep it current this way.
  using Listener = void (*)(const OptionValue& value);
  void add_listener(Listener listener);

  // The option specs graphtrain ships with.
  static std::vector<OptionSpec> builtin_specs();
  // Validates `raw` for `spec` and returns its canonical form; `origin` names where the value came
  // from in the error message (an environment variable or "the API").
  static std::string canonicalize(const OptionSpec& spec, std::string_view raw,
                                  std::string_view origin);

 private:
  size_t index_of(std::string_view name) const;
  std::string typed(std::string_view name, OptionType a, OptionType b) const;

  void notify(const std::vector<OptionValue>& changed);

  mutable std::mutex mutex_;
  std::vector<OptionSpec> specs_;
  std::vector<OptionValue> values_;
  std::vector<Listener> listeners_;
  const char* (*getenv_)(const char*);
};

}  // namespace graphtrain
