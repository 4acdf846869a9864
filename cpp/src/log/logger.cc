#include "graphtrain/log.h"

#include <unistd.h>

#include <cctype>
#include <cstdlib>

#include "graphtrain/error.h"
#include "graphtrain/options.h"

namespace graphtrain {
namespace {

constexpr const char* kLevelNames[] = {"VERBOSE", "DEVINFO", "INFO", "WARNING", "ERROR", "FATAL"};

int rank_from_env() {
  const char* raw = std::getenv("RANK");
  if (raw == nullptr || *raw == '\0') return 0;
  char* end = nullptr;
  long r = std::strtol(raw, &end, 10);
  return (*end == '\0' && r >= 0) ? static_cast<int>(r) : 0;
}

void follow_log_level(const OptionValue& v) {
  if (v.spec->name == "log_level") Logger::global().set_level(parse_log_level(v.value));
}

void write_stderr(const LogRecord& record) {
  std::string line = Logger::format(record);
  line.push_back('\n');
  // One write(2) per record keeps lines from different threads whole.
  const char* p = line.data();
  size_t left = line.size();
  while (left > 0) {
    ssize_t n = ::write(2, p, left);
    if (n <= 0) break;
    p += n;
    left -= static_cast<size_t>(n);
  }
}

}  // namespace

const char* to_string(LogLevel level) {
  int i = static_cast<int>(level);
  return (i >= 0 && i < 6) ? kLevelNames[i] : "?";
}

LogLevel parse_log_level(std::string_view name) {
  std::string u(name);
  for (char& c : u) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  for (int i = 0; i < 6; ++i)
    if (u == kLevelNames[i]) return static_cast<LogLevel>(i);
  throw OptionError(
      "'" + std::string(name) +
      "' is not a log level; accepted: VERBOSE, DEVINFO, INFO, WARNING, ERROR, FATAL.");
}

Logger::Logger() : rank_(rank_from_env()) {
  Options& options = Options::global();
  level_ = parse_log_level(options.get_string("log_level"));
  options.add_listener(&follow_log_level);
}

Logger& Logger::global() {
  static Logger instance;
  return instance;
}

bool Logger::enabled(LogLevel level) const {
  LogLevel threshold = this->level();
  if (level < threshold) return false;
  // At WARNING and above only rank 0 speaks, so N ranks do not print N copies of each warning.
  // Errors are the exception: a failure on one rank must be seen whichever rank it is.
  if (threshold >= LogLevel::kWarning && level < LogLevel::kError && rank() != 0) return false;
  return true;
}

void Logger::emit(LogLevel level, std::string_view message, const char* file, int line) {
  int r = rank();
  LogRecord record{level, r, r != 0 || this->level() <= LogLevel::kInfo, message, file, line};
  std::shared_ptr<const LogSink> sink;
  {
    std::lock_guard<std::mutex> lock(sink_mutex_);
    sink = sink_;
  }
  // The sink runs without the lock held: a Python sink takes the GIL, and a thread holding the GIL
  // may be waiting to log too.
  if (sink)
    (*sink)(record);
  else
    write_stderr(record);
}

void Logger::set_sink(LogSink sink) {
  std::lock_guard<std::mutex> lock(sink_mutex_);
  sink_ = sink ? std::make_shared<const LogSink>(std::move(sink)) : nullptr;
}

std::string Logger::format(const LogRecord& record) {
  std::string out = str_cat("graphtrain ", to_string(record.level));
  if (record.show_rank) out += str_cat(" [rank ", record.rank, "]");
  out += ": ";
  out.append(record.message);
  return out;
}

}  // namespace graphtrain
