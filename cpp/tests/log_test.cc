#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "graphtrain/error.h"
#include "graphtrain/log.h"

namespace graphtrain {
namespace {

struct Seen {
  LogLevel level;
  int rank;
  bool show_rank;
  std::string message;
};

class LogTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Logger& l = Logger::global();
    saved_level_ = l.level();
    saved_rank_ = l.rank();
    seen_.clear();
    l.set_sink([this](const LogRecord& r) {
      seen_.push_back({r.level, r.rank, r.show_rank, std::string(r.message)});
    });
  }
  void TearDown() override {
    Logger& l = Logger::global();
    l.set_sink(nullptr);
    l.set_level(saved_level_);
    l.set_rank(saved_rank_);
  }
  std::vector<Seen> seen_;
  LogLevel saved_level_{};
  int saved_rank_ = 0;
};

TEST_F(LogTest, LevelFilters) {
  Logger::global().set_level(LogLevel::kWarning);
  Logger::global().set_rank(0);
  GT_INFO("hidden");
  GT_WARNING("shown ", 42);
  ASSERT_EQ(seen_.size(), 1u);
  EXPECT_EQ(seen_[0].message, "shown 42");
  EXPECT_FALSE(seen_[0].show_rank);  // a single-process user sees no rank tag at WARNING
}

TEST_F(LogTest, AtWarningOnlyRankZeroLogsButErrorsAlwaysDo) {
  Logger& l = Logger::global();
  l.set_level(LogLevel::kWarning);
  l.set_rank(3);
  GT_WARNING("rank 3 warning");
  EXPECT_TRUE(seen_.empty());
  GT_ERROR("rank 3 error");
  ASSERT_EQ(seen_.size(), 1u);
  EXPECT_EQ(seen_[0].rank, 3);
  EXPECT_TRUE(seen_[0].show_rank);
  EXPECT_EQ(Logger::format({LogLevel::kError, 3, true, "boom", "", 0}),
            "graphtrain ERROR [rank 3]: boom");
}

TEST_F(LogTest, AtInfoEveryRankLogsWithItsRank) {
  Logger& l = Logger::global();
  l.set_level(LogLevel::kInfo);
  l.set_rank(2);
  GT_INFO("info");
  GT_WARNING("warning");
  GT_DEVINFO("too low");
  ASSERT_EQ(seen_.size(), 2u);
  for (const auto& s : seen_) {
    EXPECT_EQ(s.rank, 2);
    EXPECT_TRUE(s.show_rank);
  }
  l.set_rank(0);
  GT_INFO("rank 0 at INFO");
  EXPECT_TRUE(seen_.back().show_rank);
}

void log_once_site() {
  GT_LOG_ONCE(LogLevel::kWarning, "once");
}

TEST_F(LogTest, LogOnceEmitsOncePerSiteAndFilteredRecordsDoNotUseItUp) {
  Logger& l = Logger::global();
  l.set_rank(0);
  l.set_level(LogLevel::kError);
  log_once_site();  // filtered: must not use up the site
  EXPECT_TRUE(seen_.empty());
  l.set_level(LogLevel::kWarning);
  for (int i = 0; i < 5; ++i) log_once_site();
  EXPECT_EQ(seen_.size(), 1u);
}

TEST_F(LogTest, ParseLogLevel) {
  EXPECT_EQ(parse_log_level("devinfo"), LogLevel::kDevInfo);
  EXPECT_EQ(parse_log_level("FATAL"), LogLevel::kFatal);
  EXPECT_THROW(parse_log_level("LOUD"), OptionError);
}

}  // namespace
}  // namespace graphtrain
