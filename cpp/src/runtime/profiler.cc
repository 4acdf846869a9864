#include "graphtrain/profiler.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <map>
#include <mutex>

#include "graphtrain/file_util.h"
#include "graphtrain/options.h"
#include "graphtrain/strings.h"

namespace graphtrain {
namespace {

// A trace holding more events than this stops recording (about 200 bytes each).
constexpr size_t kMaxEvents = 2'000'000;

void append_json_string(std::string& out, std::string_view s) {
  out.push_back('"');
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out.push_back('\\');
      out.push_back(c);
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      out.append(buf);
    } else {
      out.push_back(c);
    }
  }
  out.push_back('"');
}

void append_us(std::string& out, int64_t ns) {
  // Microseconds with three decimals, as the trace format counts time.
  out.append(std::to_string(ns / 1000));
  out.push_back('.');
  std::string frac = std::to_string(ns % 1000);
  out.append(3 - frac.size(), '0');
  out.append(frac);
}

void follow_profile_option(const OptionValue& v) {
  if (v.spec->name != "profile") return;
  if (v.value.empty())
    Profiler::global().stop();
  else
    Profiler::global().start();
}

}  // namespace

struct Profiler::State {
  std::atomic<bool> active{false};
  std::chrono::steady_clock::time_point epoch = std::chrono::steady_clock::now();
  mutable std::mutex mu;
  std::vector<ProfileEvent> events;
  size_t written = 0;  // events in the file flush() last wrote
  bool full = false;
};

Profiler::Profiler() : state_(new State) {
  Options& options = Options::global();
  if (!options.get_string("profile").empty()) start();
  options.add_listener(&follow_profile_option);
}

Profiler::~Profiler() {
  // The process is exiting: the trace the option asked for is written now.
  try {
    flush();
  } catch (...) {
  }
  delete state_;
}

Profiler& Profiler::global() {
  static Profiler instance;
  return instance;
}

bool Profiler::active() const {
  return state_->active.load(std::memory_order_relaxed);
}
void Profiler::start() {
  state_->active.store(true);
}
void Profiler::stop() {
  state_->active.store(false);
}

void Profiler::clear() {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->events.clear();
  state_->written = 0;
  state_->full = false;
}

int64_t Profiler::now_ns() const {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() -
                                                              state_->epoch)
      .count();
}

void Profiler::record(ProfileEvent event) {
  std::lock_guard<std::mutex> lock(state_->mu);
  if (state_->events.size() >= kMaxEvents) {
    state_->full = true;
    return;
  }
  state_->events.push_back(std::move(event));
}

size_t Profiler::num_events() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->events.size();
}

std::vector<ProfileRow> Profiler::by_op() const {
  return totals([](const ProfileEvent& e) { return e.name; });
}

std::vector<ProfileRow> Profiler::by_module() const {
  return totals([](const ProfileEvent& e) { return e.scope.empty() ? "(no module)" : e.scope; });
}

std::vector<ProfileRow> Profiler::totals(std::string (*key_of)(const ProfileEvent&)) const {
  std::map<std::string, ProfileRow> rows;
  std::lock_guard<std::mutex> lock(state_->mu);
  for (const ProfileEvent& e : state_->events) {
    if (e.category != "kernel") continue;
    std::string key = key_of(e);
    ProfileRow& r = rows[key];
    r.key = key;
    r.ms += static_cast<double>(e.duration_ns) * 1e-6;
    r.calls += 1;
  }
  std::vector<ProfileRow> out;
  for (const auto& [key, row] : rows) out.push_back(row);
  std::stable_sort(out.begin(), out.end(),
                   [](const ProfileRow& a, const ProfileRow& b) { return a.ms > b.ms; });
  return out;
}

std::string Profiler::chrome_trace() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  std::string out = "{\"displayTimeUnit\": \"ms\", \"otherData\": {\"producer\": \"graphtrain\"";
  if (state_->full)
    out += str_cat(", \"truncated\": \"recording stopped after ", kMaxEvents, " events\"");
  out += "},\n\"traceEvents\": [\n";
  out +=
      "{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": 0, \"tid\": 0, \"args\": {\"name\": "
      "\"graphtrain\"}}";
  for (const ProfileEvent& e : state_->events) {
    out += ",\n{\"name\": ";
    append_json_string(out, e.name);
    out += ", \"cat\": ";
    append_json_string(out, e.category);
    out += ", \"ph\": \"X\", \"pid\": 0, \"tid\": 0, \"ts\": ";
    append_us(out, e.start_ns);
    out += ", \"dur\": ";
    append_us(out, e.duration_ns);
    out += ", \"args\": {\"graph\": ";
    append_json_string(out, e.graph);
    if (e.category == "kernel") {
      out += ", \"node\": ";
      append_json_string(out, e.node);
      out += ", \"module\": ";
      append_json_string(out, e.scope);
      out += ", \"input_shapes\": ";
      append_json_string(out, e.shapes);
    }
    out += "}}";
  }
  out += "\n]}\n";
  return out;
}

void Profiler::write(const std::string& path) const {
  write_file_atomic(path, chrome_trace());
}

void Profiler::flush() {
  std::string path = Options::global().get_string("profile");
  if (path.empty()) return;
  size_t n = num_events();
  if (n == 0 || n == state_->written) return;
  write(path);
  state_->written = n;
}

}  // namespace graphtrain
