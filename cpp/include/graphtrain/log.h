// One logger for C++ and Python. Records below the level, and records of other ranks than 0 while
// the level is WARNING or above, are dropped before any formatting. Python installs a sink that
// forwards records to the standard `logging` module (logger "graphtrain").
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include "graphtrain/strings.h"

namespace graphtrain {

enum class LogLevel : int {
  kVerbose = 0,
  kDevInfo = 1,
  kInfo = 2,
  kWarning = 3,
  kError = 4,
  kFatal = 5
};

const char* to_string(LogLevel level);
// Parses a level name in any case; throws OptionError naming the value and the accepted names.
LogLevel parse_log_level(std::string_view name);

struct LogRecord {
  LogLevel level;
  int rank;
  bool show_rank;  // whether the rank belongs in the formatted line
  std::string_view message;
  const char* file;
  int line;
};

using LogSink = std::function<void(const LogRecord&)>;

class Logger {
 public:
  // Reads the level from the runtime options (GRAPHTRAIN_LOG_LEVEL) and follows later changes;
  // the rank starts from the RANK environment variable, else 0.
  static Logger& global();

  LogLevel level() const { return level_.load(std::memory_order_relaxed); }
  void set_level(LogLevel level) { level_.store(level, std::memory_order_relaxed); }
  int rank() const { return rank_.load(std::memory_order_relaxed); }
  void set_rank(int rank) { rank_.store(rank, std::memory_order_relaxed); }

  // Whether a record of `level` would be emitted on this rank.
  bool enabled(LogLevel level) const;
  void emit(LogLevel level, std::string_view message, const char* file = "", int line = 0);

  // Replaces the sink; nullptr restores the default, which writes formatted lines to stderr.
  void set_sink(LogSink sink);

  // "graphtrain WARNING [rank 1]: message"
  static std::string format(const LogRecord& record);

 private:
  Logger();
  std::atomic<LogLevel> level_{LogLevel::kWarning};
  std::atomic<int> rank_{0};
  std::mutex sink_mutex_;
  std::shared_ptr<const LogSink> sink_;
};

}  // namespace graphtrain

#define GT_LOG(level, ...)                                                            \
  do {                                                                                \
    auto& gt_logger_ = ::graphtrain::Logger::global();                                \
    if (gt_logger_.enabled(level))                                                    \
      gt_logger_.emit(level, ::graphtrain::str_cat(__VA_ARGS__), __FILE__, __LINE__); \
  } while (0)

// Emits at most once per call site for the process's lifetime (a record that the level filtered
// out does not use up the site's one emission).
#define GT_LOG_ONCE(level, ...)                                                       \
  do {                                                                                \
    static std::atomic<bool> gt_logged_once_{false};                                  \
    auto& gt_logger_ = ::graphtrain::Logger::global();                                \
    if (gt_logger_.enabled(level) && !gt_logged_once_.exchange(true))                 \
      gt_logger_.emit(level, ::graphtrain::str_cat(__VA_ARGS__), __FILE__, __LINE__); \
  } while (0)

#define GT_VERBOSE(...) GT_LOG(::graphtrain::LogLevel::kVerbose, __VA_ARGS__)
#define GT_DEVINFO(...) GT_LOG(::graphtrain::LogLevel::kDevInfo, __VA_ARGS__)
#define GT_INFO(...) GT_LOG(::graphtrain::LogLevel::kInfo, __VA_ARGS__)
#define GT_WARNING(...) GT_LOG(::graphtrain::LogLevel::kWarning, __VA_ARGS__)
#define GT_ERROR(...) GT_LOG(::graphtrain::LogLevel::kError, __VA_ARGS__)
